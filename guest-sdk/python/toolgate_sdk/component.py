"""The component's export, for componentize-py: the WIT ``tool`` interface
implemented over the Tools registered with ``export_tools``.

Only importable inside a component (it needs the ``wit_world`` bindings that
componentize-py generates for the ``toolgate:python/plugin`` world). The entry
module ``toolgate build`` generates imports the project's module, then this
``Tool``. It converts between WIT types and the SDK's plain types and nothing
else.
"""

from __future__ import annotations

from componentize_py_types import Err
from wit_world import exports
from wit_world.imports import log as _log
from wit_world.imports import state as _state
from wit_world.imports import toolgate_plugin_types as types

import toolgate_sdk

_LEVELS = {
    "trace": _log.Level.TRACE,
    "debug": _log.Level.DEBUG,
    "info": _log.Level.INFO,
    "warn": _log.Level.WARN,
    "error": _log.Level.ERROR,
}


class _HostState:
    """The state view backed by the host's read-only ``state`` import."""

    def get(self, key: str) -> str | None:
        return _state.get(key)

    def keys(self) -> list[str]:
        return _state.keys()


def _write_log(level: str, message: str) -> None:
    _log.log(_LEVELS.get(level, _log.Level.INFO), message)


class Tool(exports.Tool):
    def describe(self) -> str:
        return toolgate_sdk.describe()

    def call(self, tool_id: str, arguments: str) -> types.ToolOutput:
        try:
            out = toolgate_sdk.dispatch(tool_id, arguments, _HostState(), _write_log)
        except toolgate_sdk.InvalidArguments as e:
            raise Err(types.ToolError_InvalidArguments(e.message))
        except toolgate_sdk.ToolError as e:
            raise Err(types.ToolError_Failed(e.message))
        except Exception as e:
            # Anything else is still the Tool's failure, in words the model
            # reads — not a trap the host can only call a crash.
            raise Err(types.ToolError_Failed(f"`{tool_id}` raised {type(e).__name__}: {e}"))
        commands = [
            types.Command(
                c.scope,
                c.key,
                types.CommandOp_Set(c.value) if c.value is not None else types.CommandOp_Remove(),
            )
            for c in out.commands
        ]
        return types.ToolOutput(types.Content_Json(out.json), commands)
