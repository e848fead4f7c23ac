"""A state tool in Python: notes kept in the Tool's own committed state. It
reads state through the host's read-only view and changes it only through
Commands (``cx.set`` / ``cx.remove``), which the host commits atomically with
the call's result. The same Tool as the Rust `notes` example."""

import enum
from dataclasses import dataclass
from typing import Optional

from toolgate_sdk import Annotations, Context, InvalidArguments, Tool, export_tools

KEY = "notes"


class Op(enum.Enum):
    """`add`, `list` or `clear`."""

    ADD = "add"
    LIST = "list"
    CLEAR = "clear"


@dataclass
class NotesArgs:
    """Arguments of `notes`.

    Attributes:
        op: `add`, `list` or `clear`.
        note: The note, for `add`.
    """

    op: Op
    note: Optional[str] = None


@dataclass
class NotesOutput:
    """What `notes` returns.

    Attributes:
        notes: The notes after the operation.
    """

    notes: list[str]


class Notes(Tool):
    ID = "notes"
    DESCRIPTION = "Keep notes across runs: op=add with a note, op=list, or op=clear."
    ANNOTATIONS = Annotations(destructive=False, open_world=False)

    def call(self, args: NotesArgs, cx: Context) -> NotesOutput:
        notes: list[str] = cx.get(KEY, [])
        if args.op is Op.ADD:
            if args.note is None:
                raise InvalidArguments("op=add needs `note`")
            notes.append(args.note)
            cx.set(KEY, notes)
        elif args.op is Op.CLEAR:
            notes = []
            cx.remove(KEY)
        return NotesOutput(notes)


export_tools(Notes)
