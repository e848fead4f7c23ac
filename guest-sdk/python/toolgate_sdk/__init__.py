"""toolgate-sdk for Python: write typed AI-agent Tools that toolgate hosts load
as WebAssembly components (built with componentize-py).

```python
from dataclasses import dataclass
from toolgate_sdk import Context, Tool, export_tools

@dataclass
class UpperArgs:
    \"\"\"Arguments of `text.upper`.

    Attributes:
        text: The text to upper-case.
    \"\"\"
    text: str

class Upper(Tool):
    ID = "text.upper"
    DESCRIPTION = "Upper-case a text."

    def call(self, args: UpperArgs, cx: Context) -> str:
        return args.text.upper()

export_tools(Upper)
```

`toolgate build` turns a project holding this module into a packed component.

This package owns the Tool side of the contract for Python: the ``Tool`` base
class, the one descriptor source (the type hints of ``call``, through
``schema``), and the one raw-to-typed adapter (``dispatch``). It never grants
authority: a Tool only *declares* what it needs; the host decides.
"""

from __future__ import annotations

import inspect
import json
import math
import traceback
import typing
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Iterable, Protocol

from . import schema as _schema
from .schema import Field, SchemaError

__version__ = "0.1.0"
__all__ = [
    "Access",
    "Annotations",
    "Capabilities",
    "Command",
    "Context",
    "Failed",
    "Field",
    "InvalidArguments",
    "SchemaError",
    "Tool",
    "ToolError",
    "describe",
    "dispatch",
    "export_tools",
]

#: Layout version of the metadata document (`toolgate-metadata` section).
METADATA_FORMAT = 1
#: The WIT package every Tool component targets.
WIT = "toolgate:plugin@0.1.0"
#: The world `toolgate build` hands componentize-py.
WORLD = "toolgate:python/plugin"


def wit_dir() -> str:
    """The directory holding the WIT this SDK implements (for componentize-py ``-d``)."""
    import os

    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "wit")


# ---------------------------------------------------------------- errors


class ToolError(Exception):
    """A Tool error: committed as a result the model reads."""

    kind: ClassVar[str] = "failed"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidArguments(ToolError):
    """The arguments do not fit; say which field and what is expected."""

    kind = "invalid-arguments"


class Failed(ToolError):
    """The Tool ran and failed; say why."""

    kind = "failed"


# ---------------------------------------------------------------- declarations

Access = typing.Literal["read", "read-write"]


@dataclass(frozen=True)
class Capabilities:
    """The authority a Tool says it needs: a request, never a grant.

    ``Capabilities().directory("/data", "read").host("https://api.example.com:443").credential("api")``
    """

    directories: tuple[tuple[str, str], ...] = ()
    hosts: tuple[str, ...] = ()
    credentials: tuple[str, ...] = ()

    def directory(self, guest_path: str, access: Access = "read") -> Capabilities:
        if access not in ("read", "read-write"):
            raise ValueError(f"directory access must be 'read' or 'read-write', not {access!r}")
        return Capabilities(self.directories + ((guest_path, access),), self.hosts, self.credentials)

    def host(self, destination: str) -> Capabilities:
        return Capabilities(self.directories, self.hosts + (destination,), self.credentials)

    def credential(self, name: str) -> Capabilities:
        return Capabilities(self.directories, self.hosts, self.credentials + (name,))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.directories:
            out["directories"] = [{"path": p, "access": a} for p, a in self.directories]
        if self.hosts:
            out["hosts"] = list(self.hosts)
        if self.credentials:
            out["credentials"] = list(self.credentials)
        return out


@dataclass(frozen=True)
class Annotations:
    """Behaviour hints for clients (MCP tool annotations); hints, not grants."""

    read_only: bool | None = None
    destructive: bool | None = None
    idempotent: bool | None = None
    open_world: bool | None = None

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self).items() if v is not None}


# ---------------------------------------------------------------- state


class StateView(Protocol):
    """Read access to the called Tool's committed state (JSON text per key)."""

    def get(self, key: str) -> str | None: ...

    def keys(self) -> list[str]: ...


@dataclass
class Command:
    """A change to the Tool's own state, applied atomically with the result."""

    scope: str
    key: str
    value: str | None  # JSON text to set, or None to remove


class MemoryState:
    """A ``StateView`` over a dict of JSON values, for a Tool's native tests."""

    def __init__(self, values: dict[str, Any] | None = None) -> None:
        self.values = {k: json.dumps(v) for k, v in (values or {}).items()}

    def get(self, key: str) -> str | None:
        return self.values.get(key)

    def keys(self) -> list[str]:
        return sorted(self.values)


class Context:
    """What a Tool sees of the host during one call."""

    def __init__(self, tool_id: str, state: StateView, log: Callable[[str, str], None] | None = None) -> None:
        self.tool_id = tool_id
        self._state = state
        self._log = log
        self.commands: list[Command] = []

    def get(self, key: str, default: Any = None) -> Any:
        """The committed value under ``key`` (parsed JSON), or ``default``."""
        raw = self._state.get(key)
        if raw is None:
            return default
        try:
            return json.loads(raw)
        except ValueError as e:
            raise Failed(f"state key `{key}` holds unreadable JSON: {e}") from None

    def keys(self) -> list[str]:
        """All keys of the Tool's committed state, sorted."""
        return list(self._state.keys())

    def set(self, key: str, value: Any) -> None:
        """Set ``key`` to ``value`` when the call's result commits.

        Keys beginning ``cache/`` hold values the Tool can recompute: last
        writer wins, and they never make a concurrent call conflict."""
        try:
            text = json.dumps(_schema.encode(value), ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError) as e:
            raise Failed(f"cannot store state `{key}`: {e}") from None
        self.commands.append(Command(self.tool_id, key, text))

    def remove(self, key: str) -> None:
        """Remove ``key`` when the call's result commits."""
        self.commands.append(Command(self.tool_id, key, None))

    def log(self, message: str, level: str = "info") -> None:
        """Write to the step's captured log (never the host's own output)."""
        if level not in ("trace", "debug", "info", "warn", "error"):
            raise ValueError(f"log level must be trace, debug, info, warn or error, not {level!r}")
        if self._log is not None:
            self._log(level, message)


# ---------------------------------------------------------------- tools


class Tool:
    """A typed Tool. Subclass it, set ``ID`` and ``DESCRIPTION``, and write
    ``call(self, args: Args, cx: Context) -> Output``: the argument schema the
    model sees is derived from ``Args`` (a dataclass or ``TypedDict``), the
    output schema from ``Output``.
    """

    #: Unique id, e.g. ``text.upper``: letters, digits, ``_``, ``-``, ``.``.
    ID: ClassVar[str]
    #: What the Tool does, written for the model.
    DESCRIPTION: ClassVar[str]
    #: The argument permission rules like ``tool(glob)`` match, if any.
    PRIMARY_ARGUMENT: ClassVar[str | None] = None
    #: Authority the Tool needs. Default: none.
    CAPABILITIES: ClassVar[Capabilities] = Capabilities()
    #: Behaviour hints for clients. Default: none.
    ANNOTATIONS: ClassVar[Annotations] = Annotations()

    def call(self, args: Any, cx: Context) -> Any:
        raise NotImplementedError


@dataclass
class _Entry:
    tool: type[Tool]
    args: Any
    output: Any  # the return annotation, or _NO_OUTPUT


_NO_OUTPUT = object()


def _entry(tool: type[Tool]) -> _Entry:
    name = getattr(tool, "__qualname__", repr(tool))
    if not (isinstance(tool, type) and issubclass(tool, Tool)):
        raise SchemaError(f"export_tools: `{name}` is not a subclass of toolgate_sdk.Tool")
    for attr in ("ID", "DESCRIPTION"):
        if not isinstance(getattr(tool, attr, None), str) or not getattr(tool, attr):
            raise SchemaError(f"`{name}` needs a non-empty string `{attr}`")
    if tool.call is Tool.call:
        raise SchemaError(f"`{name}` does not define `call(self, args, cx)`")
    # Through decorators (`functools.wraps` sets `__wrapped__`): the
    # signature `inspect` follows, the hints of the function it reaches (whose
    # module resolves their names).
    try:
        hints = typing.get_type_hints(inspect.unwrap(tool.call), include_extras=True)
        signature = inspect.signature(tool.call)
    except Exception as e:
        raise SchemaError(f"cannot read the type hints of `{name}.call`: {e}") from e
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    params = [p.name for p in signature.parameters.values() if p.kind in positional][1:]
    if not params or params[0] not in hints:
        raise SchemaError(
            f"`{name}.call` needs a typed first argument, e.g. `def call(self, args: MyArgs, cx: Context)`; "
            "its type is the schema the model sees"
        )
    return _Entry(tool, hints[params[0]], hints.get("return", _NO_OUTPUT))


def _metadata(entry: _Entry) -> dict[str, Any]:
    tool = entry.tool
    where = f"{tool.ID} arguments"
    input_schema = _schema.schema_of(entry.args, where)
    if input_schema.get("type") != "object":
        raise SchemaError(f"`{tool.ID}`: arguments must be a dataclass or TypedDict (a JSON object)")
    input_schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", **input_schema}
    descriptor: dict[str, Any] = {
        "id": tool.ID,
        "description": tool.DESCRIPTION,
        "input_schema": input_schema,
    }
    if entry.output is not _NO_OUTPUT:
        out = _schema.schema_of(entry.output, f"{tool.ID} output")
        descriptor["output_schema"] = {"$schema": "https://json-schema.org/draft/2020-12/schema", **out}
    descriptor["annotations"] = tool.ANNOTATIONS.to_json()
    if tool.PRIMARY_ARGUMENT is not None:
        descriptor["primary_argument"] = tool.PRIMARY_ARGUMENT
    metadata = {"descriptor": descriptor, "capabilities": tool.CAPABILITIES.to_json()}
    # What `toolgate pack` embeds must be JSON: refused here, naming the Tool
    # and the field, not later by the host with no word of where.
    bad = _not_json(metadata, "")
    if bad is not None:
        where, value = bad
        raise SchemaError(
            f"`{getattr(tool, '__qualname__', tool.ID)}` ({tool.ID}): metadata `{where}` is `{value!r}`, "
            "which has no JSON form (NaN and infinities included)"
        )
    return metadata


def _not_json(value: Any, where: str) -> tuple[str, Any] | None:
    """The first place in ``value`` (as ``a.b[0]``) holding what ``json.dumps(..., allow_nan=False)`` refuses."""
    if value is None or isinstance(value, (bool, int, str)):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else (where, value)
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            bad = _not_json(v, f"{where}[{i}]")
            if bad is not None:
                return bad
        return None
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                return (f"{where}.{k!r}" if where else repr(k)), k
            bad = _not_json(v, f"{where}.{k}" if where else k)
            if bad is not None:
                return bad
        return None
    return where, value


_REGISTRY: list[_Entry] = []


def export_tools(*tools: type[Tool]) -> None:
    """Export these Tools from the component (call once, in the project's module)."""
    entries = [_entry(t) for t in tools]
    ids = [e.tool.ID for e in _REGISTRY + entries]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise SchemaError(f"Tool id `{dup[0]}` is exported twice")
    # Derive every schema now, so a type without one fails the build, not a call.
    for e in entries:
        _metadata(e)
    _REGISTRY.extend(entries)


def exported() -> list[type[Tool]]:
    """The Tools registered with ``export_tools``, in order."""
    return [e.tool for e in _REGISTRY]


def describe(tools: Iterable[type[Tool]] | None = None) -> str:
    """The component's metadata document (what ``toolgate pack`` embeds)."""
    entries = [_entry(t) for t in tools] if tools is not None else _REGISTRY
    doc = {
        "format": METADATA_FORMAT,
        "wit": WIT,
        "sdk": f"python-{__version__}",
        "tools": [_metadata(e) for e in entries],
    }
    return json.dumps(doc, ensure_ascii=False, allow_nan=False)


@dataclass
class Output:
    """A successful raw call: JSON content and state Commands."""

    json: str
    commands: list[Command] = field(default_factory=list)


def dispatch(
    tool_id: str,
    arguments: str,
    state: StateView,
    log: Callable[[str, str], None] | None = None,
    tools: Iterable[type[Tool]] | None = None,
) -> Output:
    """Run ``tool_id`` on JSON ``arguments``: decode them into the Tool's typed
    arguments, call it, encode its output. Raises ``ToolError``."""
    entries = [_entry(t) for t in tools] if tools is not None else _REGISTRY
    entry = next((e for e in entries if e.tool.ID == tool_id), None)
    if entry is None:
        raise Failed(f"this component does not export a Tool `{tool_id}`")
    try:
        value = json.loads(arguments)
    except ValueError as e:
        raise InvalidArguments(f"arguments for `{tool_id}` are not JSON: {e}") from None
    if value is None:
        value = {}
    try:
        args = _schema.decode(entry.args, value)
    except _schema.DecodeError as e:
        raise InvalidArguments(f"invalid arguments for `{tool_id}`: {e}") from None
    except Exception as e:
        # Raised by the arguments' own class while it is built (a
        # dataclass's `__post_init__` checking a field): the model's to fix.
        raise InvalidArguments(f"invalid arguments for `{tool_id}`: {type(e).__name__}: {e}") from None
    cx = Context(tool_id, state, log)
    try:
        result = entry.tool().call(args, cx)
    except ToolError:
        raise
    except Exception as e:
        # An unexpected exception is the Tool's failure, reported to the model
        # by type and message; the traceback goes to the step's captured log.
        if log is not None:
            log("error", traceback.format_exc())
        raise Failed(f"`{tool_id}` raised {type(e).__name__}: {e}") from None
    try:
        # No NaN or Infinity: they are not JSON, and the host refuses them.
        text = json.dumps(_schema.encode(result), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise Failed(f"`{tool_id}` produced output with no JSON form: {e}") from None
    return Output(text, cx.commands)
