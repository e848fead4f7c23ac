"""A pure multi-tool component in Python: text transformations with no
authority and no state. The same Tools as the Rust `text` example, so the
end-to-end suite runs one set of proofs over both."""

from dataclasses import dataclass
from typing import Annotated, Optional

from toolgate_sdk import Annotations, Context, Field, InvalidArguments, Tool, export_tools

PURE = Annotations(read_only=True, idempotent=True, open_world=False)


@dataclass
class TextArgs:
    """Arguments shared by the text tools.

    Attributes:
        text: The text to work on.
    """

    text: str


class Upper(Tool):
    ID = "text.upper"
    DESCRIPTION = "Return the text in upper case."
    PRIMARY_ARGUMENT = "text"
    ANNOTATIONS = PURE

    def call(self, args: TextArgs, cx: Context) -> str:
        return args.text.upper()


@dataclass
class Counts:
    """Counts of a text.

    Attributes:
        chars: Unicode scalar values.
        words: Whitespace-separated words.
        lines: Lines.
    """

    chars: Annotated[int, Field(minimum=0)]
    words: Annotated[int, Field(minimum=0)]
    lines: Annotated[int, Field(minimum=0)]


class Count(Tool):
    ID = "text.count"
    DESCRIPTION = "Count the characters, words and lines of a text."
    PRIMARY_ARGUMENT = "text"
    ANNOTATIONS = PURE

    def call(self, args: TextArgs, cx: Context) -> Counts:
        return Counts(chars=len(args.text), words=len(args.text.split()), lines=len(args.text.splitlines()))


@dataclass
class RepeatArgs:
    """Arguments of `text.repeat`.

    Attributes:
        text: The text to repeat.
        times: How many times (1 to 100).
        separator: Put between repetitions; default none.
    """

    text: str
    times: Annotated[int, Field(minimum=1, maximum=100)]
    separator: Optional[str] = None


class Repeat(Tool):
    ID = "text.repeat"
    DESCRIPTION = "Repeat a text a number of times, optionally with a separator."
    ANNOTATIONS = PURE

    def call(self, args: RepeatArgs, cx: Context) -> str:
        if not 1 <= args.times <= 100:
            raise InvalidArguments("`times` must be between 1 and 100")
        return (args.separator or "").join([args.text] * args.times)


export_tools(Upper, Count, Repeat)
