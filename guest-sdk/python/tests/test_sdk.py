"""Native tests of the Python SDK: the schema the model sees is derived from
the same type hints that decode the arguments, and the raw adapter keeps the
error model. Run: `python -m unittest discover -s guest-sdk/python/tests`."""

import enum
import functools
import json
import math
import sys
import types
import typing
import unittest
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal, Optional, TypedDict

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from toolgate_sdk import (  # noqa: E402
    Annotations,
    Capabilities,
    Context,
    Failed,
    Field,
    InvalidArguments,
    MemoryState,
    SchemaError,
    Tool,
    describe,
    dispatch,
    export_tools,
)
from toolgate_sdk.schema import DecodeError, decode, schema_of  # noqa: E402


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


@dataclass
class Inner:
    """A nested record.

    Attributes:
        depth: How deep.
    """

    depth: int


@dataclass
class Args:
    """Everything the SDK maps.

    Attributes:
        name: Who.
        times: How many
            times, at most ten.
        tags: Labels.
    """

    name: str
    times: Annotated[int, Field(minimum=1, maximum=10)]
    tags: list[str]
    color: Color
    mode: Literal["fast", "slow"]
    inner: Inner
    extra: dict[str, float]
    note: Optional[str] = None
    ratio: float = 0.5
    flags: list[bool] = field(default_factory=list)
    described: Annotated[str, "From Annotated."] = ""


@dataclass
class Loop:
    next: Optional["Loop"] = None


class Opts(TypedDict, total=False):
    level: int


class Required(TypedDict):
    """A TypedDict root.

    Attributes:
        query: What to find.
    """

    query: str
    opts: Opts


class SchemaTest(unittest.TestCase):
    def test_a_dataclass_maps_to_a_closed_object_with_docs_and_bounds(self):
        s = schema_of(Args)
        self.assertEqual(s["type"], "object")
        self.assertEqual(s["title"], "Args")
        self.assertEqual(s["description"], "Everything the SDK maps.")
        self.assertIs(s["additionalProperties"], False)
        self.assertEqual(s["required"], ["name", "times", "tags", "color", "mode", "inner", "extra"])
        p = s["properties"]
        self.assertEqual(p["name"], {"type": "string", "description": "Who."})
        self.assertEqual(
            p["times"], {"type": "integer", "minimum": 1, "maximum": 10, "description": "How many times, at most ten."}
        )
        self.assertEqual(p["tags"], {"type": "array", "items": {"type": "string"}, "description": "Labels."})
        self.assertEqual(p["color"], {"enum": ["red", "blue"], "type": "string"})
        self.assertEqual(p["mode"], {"enum": ["fast", "slow"], "type": "string"})
        self.assertEqual(p["inner"]["properties"]["depth"], {"type": "integer", "description": "How deep."})
        self.assertEqual(p["extra"], {"type": "object", "additionalProperties": {"type": "number"}})
        self.assertEqual(p["note"], {"type": ["string", "null"], "default": None})
        self.assertEqual(p["ratio"], {"type": "number", "default": 0.5})
        self.assertEqual(p["described"]["description"], "From Annotated.")

    def test_a_fields_own_description_beats_its_types(self):
        class Mood(enum.Enum):
            """A mood."""

            UP = "up"

        @dataclass
        class WithMood:
            """Attributes:
            mood: How it feels.
            """

            mood: Mood
            plain: Mood

        p = schema_of(WithMood)["properties"]
        self.assertEqual(p["mood"]["description"], "How it feels.")
        self.assertEqual(p["plain"]["description"], "A mood.")

    def test_a_typed_dict_maps_required_and_optional_keys(self):
        s = schema_of(Required)
        self.assertEqual(s["required"], ["query", "opts"])
        self.assertEqual(s["properties"]["query"]["description"], "What to find.")
        self.assertNotIn("required", s["properties"]["opts"])

    def test_types_without_a_json_form_are_refused_naming_the_field(self):
        @dataclass
        class Bad:
            ids: set[int]

        with self.assertRaises(SchemaError) as e:
            schema_of(Bad)
        self.assertIn("Bad.ids", str(e.exception))

        @dataclass
        class BadKeys:
            m: dict[int, str]

        with self.assertRaisesRegex(SchemaError, "BadKeys.m.*keys are strings"):
            schema_of(BadKeys)

        with self.assertRaisesRegex(SchemaError, "recursive"):
            schema_of(Loop)

    def test_unknown_field_keywords_are_refused(self):
        with self.assertRaisesRegex(SchemaError, "minimum_value"):
            Field(minimum_value=1)


class DecodeTest(unittest.TestCase):
    good = {
        "name": "a",
        "times": 2,
        "tags": ["x"],
        "color": "red",
        "mode": "fast",
        "inner": {"depth": 1},
        "extra": {"k": 1},
    }

    def test_json_decodes_into_the_typed_arguments(self):
        a = decode(Args, dict(self.good, note="n"))
        self.assertEqual((a.name, a.times, a.color, a.inner.depth, a.note, a.ratio), ("a", 2, Color.RED, 1, "n", 0.5))
        self.assertEqual(a.extra, {"k": 1.0})
        self.assertIsInstance(a.extra["k"], float)

    def test_every_mismatch_names_where(self):
        cases = [
            ({"times": "2"}, "times: expected an integer"),
            ({"times": True}, "times: expected an integer"),
            ({"tags": ["x", 3]}, "tags[1]: expected a string"),
            ({"color": "green"}, "color: expected one of"),
            ({"mode": "medium"}, "mode: expected one of"),
            ({"inner": {"depth": 1, "x": 2}}, "inner: unknown field `x`"),
            ({"inner": {}}, "inner: missing field `depth`"),
            ({"surprise": 1}, "unknown field `surprise`"),
        ]
        for change, message in cases:
            with self.subTest(change=change):
                with self.assertRaises(DecodeError) as e:
                    decode(Args, dict(self.good, **change))
                self.assertIn(message, str(e.exception))


@dataclass
class EchoArgs:
    """Echo arguments.

    Attributes:
        text: What to echo.
    """

    text: str


@dataclass
class EchoOut:
    text: str
    count: int


class Echo(Tool):
    ID = "t.echo"
    DESCRIPTION = "Echo and count, keeping a counter in state."
    PRIMARY_ARGUMENT = "text"
    CAPABILITIES = Capabilities().directory("/data", "read").host("https://api.example.com:443").credential("api")
    ANNOTATIONS = Annotations(read_only=False, idempotent=False)

    def call(self, args: EchoArgs, cx: Context) -> EchoOut:
        if args.text == "boom":
            raise ValueError("it went boom")
        if args.text == "refuse":
            raise InvalidArguments("`text` may not be refuse")
        if args.text == "fail":
            raise Failed("failed on purpose")
        count = cx.get("count", 0) + 1
        cx.set("count", count)
        if args.text == "reset":
            cx.remove("count")
        cx.log(f"echo {count}")
        return EchoOut(args.text, count)


class NoHints(Tool):
    ID = "t.nohints"
    DESCRIPTION = "No type hints."

    def call(self, args, cx):
        return None


class DescribeAndDispatchTest(unittest.TestCase):
    def test_the_metadata_document_is_the_hosts_format(self):
        doc = json.loads(describe([Echo]))
        self.assertEqual((doc["format"], doc["wit"]), (1, "toolgate:plugin@0.1.0"))
        self.assertTrue(doc["sdk"].startswith("python-"))
        (tool,) = doc["tools"]
        d = tool["descriptor"]
        self.assertEqual((d["id"], d["primary_argument"]), ("t.echo", "text"))
        self.assertEqual(d["input_schema"]["$schema"], "https://json-schema.org/draft/2020-12/schema")
        self.assertEqual(d["input_schema"]["properties"]["text"]["description"], "What to echo.")
        self.assertEqual(d["output_schema"]["required"], ["text", "count"])
        self.assertEqual(d["annotations"], {"read_only": False, "idempotent": False})
        self.assertEqual(
            tool["capabilities"],
            {
                "directories": [{"path": "/data", "access": "read"}],
                "hosts": ["https://api.example.com:443"],
                "credentials": ["api"],
            },
        )

    def test_a_tool_without_typed_arguments_is_refused_at_describe(self):
        with self.assertRaisesRegex(SchemaError, "typed first argument"):
            describe([NoHints])

    def test_a_call_returns_json_and_commands_scoped_to_the_tool(self):
        logs = []
        out = dispatch(
            "t.echo", '{"text": "hi"}', MemoryState({"count": 4}), lambda lvl, m: logs.append((lvl, m)), tools=[Echo]
        )
        self.assertEqual(json.loads(out.json), {"text": "hi", "count": 5})
        self.assertEqual([(c.scope, c.key, c.value) for c in out.commands], [("t.echo", "count", "5")])
        self.assertEqual(logs, [("info", "echo 5")])
        out = dispatch("t.echo", '{"text": "reset"}', MemoryState(), tools=[Echo])
        self.assertEqual([(c.key, c.value) for c in out.commands], [("count", "1"), ("count", None)])

    def test_the_error_model(self):
        state = MemoryState()
        cases = [
            ("t.echo", "not json", InvalidArguments, "arguments for `t.echo` are not JSON"),
            ("t.echo", '{"txt": "x"}', InvalidArguments, "invalid arguments for `t.echo`: arguments: unknown field"),
            ("t.echo", "null", InvalidArguments, "missing field `text`"),
            ("t.echo", '{"text": "refuse"}', InvalidArguments, "may not be refuse"),
            ("t.echo", '{"text": "fail"}', Failed, "failed on purpose"),
            ("t.echo", '{"text": "boom"}', Failed, "`t.echo` raised ValueError: it went boom"),
            ("t.other", "{}", Failed, "does not export a Tool `t.other`"),
        ]
        for tool, args, kind, message in cases:
            with self.subTest(args=args):
                with self.assertRaises(kind) as e:
                    dispatch(tool, args, state, tools=[Echo])
                self.assertIn(message, e.exception.message)

    def test_unreadable_state_is_a_tool_failure(self):
        class Broken(MemoryState):
            def get(self, key):
                return "{not json"

        with self.assertRaisesRegex(Failed, "unreadable JSON"):
            dispatch("t.echo", '{"text": "hi"}', Broken(), tools=[Echo])

    def test_http_outside_a_component_says_so(self):
        from toolgate_sdk.http import HttpError, Request

        with self.assertRaisesRegex(HttpError, "only inside a component"):
            Request.get("https://api.example.com/").credential("api").send()


@dataclass
class Checked:
    """Arguments that check themselves.

    Attributes:
        n: must not be negative.
    """

    n: int

    def __post_init__(self):
        if self.n < 0:
            raise ValueError("n must be >= 0")


@dataclass
class Derived:
    """An output with a field its constructor does not take.

    Attributes:
        a: given.
        b: derived.
    """

    a: int
    b: int = field(init=False, default=0)


class Odd(Tool):
    """Returns what it is asked to, to test the edges of the error model."""

    ID = "t.odd"
    DESCRIPTION = "Returns what it is asked to."

    def call(self, args: Checked, cx: Context) -> typing.Any:
        if args.n == 1:
            return float("nan")
        if args.n == 2:
            cx.set("x", float("inf"))
            return 0
        if args.n == 3:
            return Derived(7)
        return args.n


class Keys(TypedDict):
    """Keys, one optional by PEP 655."""

    must: int
    may: typing.NotRequired[int]


class PythonEdgesTest(unittest.TestCase):
    """What Python authors write every day, through the SDK's one schema."""

    def test_a_check_in_post_init_is_invalid_arguments_not_a_crash(self):
        with self.assertRaises(InvalidArguments) as e:
            dispatch("t.odd", '{"n": -1}', MemoryState(), tools=[Odd])
        self.assertIn("ValueError: n must be >= 0", e.exception.message)

    def test_nan_and_infinity_are_a_clear_failure_not_malformed_json(self):
        for n, where in [(1, "produced output with no JSON form"), (2, "cannot store state `x`")]:
            with self.subTest(n=n):
                with self.assertRaises(Failed) as e:
                    dispatch("t.odd", json.dumps({"n": n}), MemoryState(), tools=[Odd])
                self.assertIn(where, e.exception.message)

    def test_an_output_is_encoded_with_the_fields_its_schema_lists(self):
        out = dispatch("t.odd", '{"n": 3}', MemoryState(), tools=[Odd])
        self.assertEqual(json.loads(out.json), {"a": 7})
        self.assertEqual(list(schema_of(Derived)["properties"]), ["a"])

    def test_a_typed_dict_with_not_required_keys(self):
        schema = schema_of(Keys)
        self.assertEqual(schema["required"], ["must"])
        self.assertEqual(schema["properties"]["may"]["type"], "integer")
        self.assertEqual(decode(Keys, {"must": 1}), {"must": 1})

    def test_a_literal_number_is_compared_by_value_as_json_schema_does(self):
        self.assertEqual(decode(Literal[1, 2], 1.0), 1.0)
        for wrong in [True, "1", 3]:
            with self.subTest(wrong=wrong):
                with self.assertRaises(DecodeError):
                    decode(Literal[1, 2], wrong)
        with self.assertRaises(DecodeError):
            decode(Literal[True], 1)


def future_module(name, source):
    """A module of ``source`` under ``from __future__ import annotations``
    (every hint a string), importable as ``name`` so its hints resolve."""
    module = types.ModuleType(name)
    sys.modules[name] = module
    exec(compile("from __future__ import annotations\n" + source, name, "exec"), module.__dict__)
    return module


def strict_json(text):
    """``text`` parsed, refusing NaN and infinities as the host does."""
    return json.loads(text, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(f"not JSON: {c}")))


class Pair(enum.Enum):
    ORIGIN = (0, 0)
    UNIT = (1, 1)


class Flag(enum.Enum):
    ON = 1


class Digit(enum.IntEnum):
    ONE = 1
    TWO = 2


class Word(str, enum.Enum):
    W = "w"


class ReviewedEdgesTest(unittest.TestCase):
    """The schema says it, decode accepts exactly it, and the metadata is JSON."""

    def test_not_required_and_required_hold_under_future_annotations(self):
        m = future_module(
            "tg_future_hints",
            """
from typing import NotRequired, Required, TypedDict, Annotated
from toolgate_sdk import Context, Tool

class Keys(TypedDict):
    must: int
    may: NotRequired[int]
    said: Annotated[NotRequired[str], "Described."]

class Loose(TypedDict, total=False):
    need: Required[str]
    opt: int

class Count(Tool):
    ID = "t.future"
    DESCRIPTION = "Count."

    def call(self, args: Loose, cx: Context) -> Keys:
        return {"must": len(args["need"])}
""",
        )
        self.assertEqual(schema_of(m.Keys)["required"], ["must"])
        self.assertEqual(schema_of(m.Keys)["properties"]["said"], {"type": "string", "description": "Described."})
        self.assertEqual(schema_of(m.Loose)["required"], ["need"])
        self.assertEqual(decode(m.Keys, {"must": 1}), {"must": 1})
        with self.assertRaisesRegex(DecodeError, "missing field `need`"):
            decode(m.Loose, {"opt": 1})
        d = json.loads(describe([m.Count]))["tools"][0]["descriptor"]
        self.assertEqual((d["input_schema"]["required"], d["output_schema"]["required"]), (["need"], ["must"]))
        out = dispatch("t.future", '{"need": "ab"}', MemoryState(), tools=[m.Count])
        self.assertEqual(json.loads(out.json), {"must": 2})

    def test_metadata_that_is_not_json_is_refused_naming_the_tool_and_field(self):
        @dataclass
        class Bounded:
            n: Annotated[float, Field(maximum=math.inf)]

        class Unbounded(Tool):
            ID = "t.unbounded"
            DESCRIPTION = "Has a bound that is not JSON."

            def call(self, args: Bounded, cx: Context) -> None:
                return None

        for refuse in (export_tools, describe):
            with self.subTest(refuse=refuse.__name__):
                with self.assertRaisesRegex(
                    SchemaError, r"`.*Unbounded` \(t\.unbounded\).*`descriptor\.input_schema\.properties\.n\.maximum`"
                ):
                    refuse([Unbounded]) if refuse is describe else refuse(Unbounded)

    def test_a_default_with_no_json_form_is_left_out_not_emitted(self):
        @dataclass
        class Limits:
            limit: float = math.inf
            floor: float = -math.inf
            ratio: float = math.nan
            pairs: tuple[float, ...] = (1.0, math.inf)

        class Limited(Tool):
            ID = "t.limited"
            DESCRIPTION = "Defaults that are not JSON."

            def call(self, args: Limits, cx: Context) -> float:
                return 0.0

        doc = strict_json(describe([Limited]))
        props = doc["tools"][0]["descriptor"]["input_schema"]["properties"]
        for name in ("limit", "floor", "ratio", "pairs"):
            with self.subTest(name=name):
                self.assertNotIn("default", props[name])
        self.assertNotIn("required", schema_of(Limits))
        self.assertEqual(decode(Limits, {}).limit, math.inf)

    def test_an_enum_member_in_a_literal_is_its_value(self):
        @dataclass
        class Pick:
            color: Literal[Color.RED]
            pair: Literal[Pair.UNIT, "none"]

        class Picker(Tool):
            ID = "t.pick"
            DESCRIPTION = "Pick."

            def call(self, args: Pick, cx: Context) -> Literal[Color.BLUE]:
                return Color.BLUE

        d = strict_json(describe([Picker]))["tools"][0]["descriptor"]
        props = d["input_schema"]["properties"]
        self.assertEqual(props["color"], {"enum": ["red"], "type": "string"})
        self.assertEqual(props["pair"], {"enum": [[1, 1], "none"]})
        self.assertEqual(d["output_schema"]["enum"], ["blue"])
        self.assertIs(decode(Literal[Color.RED], "red"), Color.RED)
        self.assertIs(decode(Literal[Pair.UNIT, "none"], [1, 1]), Pair.UNIT)
        with self.assertRaisesRegex(DecodeError, "expected one of"):
            decode(Literal[Color.RED], "blue")
        out = dispatch("t.pick", '{"color": "red", "pair": "none"}', MemoryState(), tools=[Picker])
        self.assertEqual(json.loads(out.json), "blue")
        with self.assertRaisesRegex(SchemaError, "no JSON form"):
            schema_of(Literal[b"raw"])

    def test_a_decorated_call_keeps_its_typed_arguments(self):
        def logged(f):
            @functools.wraps(f)
            def wrapper(*args, **kwargs):
                return f(*args, **kwargs)

            return wrapper

        class Wrapped(Tool):
            ID = "t.wrapped"
            DESCRIPTION = "A decorated call."

            @logged
            def call(self, args: EchoArgs, cx: Context) -> EchoOut:
                return EchoOut(args.text, 1)

        d = json.loads(describe([Wrapped]))["tools"][0]["descriptor"]
        self.assertEqual(d["input_schema"]["required"], ["text"])
        self.assertEqual(d["output_schema"]["required"], ["text", "count"])
        out = dispatch("t.wrapped", '{"text": "hi"}', MemoryState(), tools=[Wrapped])
        self.assertEqual(json.loads(out.json), {"text": "hi", "count": 1})

    def test_decode_returns_the_type_the_schema_names(self):
        two = decode(Literal[1, 2], 2.0)
        self.assertEqual((two, type(two)), (2, int))
        for tp, value, want in [
            (typing.Union[float, int], 3, int),
            (typing.Union[float, int], 3.0, float),
            (typing.Union[int, float], 3.0, float),
            (typing.Union[float, str], 3, float),
            (typing.Optional[typing.Union[float, int]], 3, int),
        ]:
            with self.subTest(tp=tp, value=value):
                got = decode(tp, value)
                self.assertEqual((got, type(got)), (value, want))
        self.assertEqual([type(x) for x in decode(typing.Union[list[float], list[int]], [1, 2])], [int, int])
        self.assertEqual(decode(typing.Union[Literal[1], float], 1.0), 1.0)
        self.assertIsInstance(decode(typing.Union[Literal[1], float], 1.0), float)

    def test_an_empty_tuple_is_the_empty_array(self):
        self.assertEqual(schema_of(tuple[()]), {"type": "array", "maxItems": 0})
        self.assertEqual(decode(tuple[()], []), ())
        with self.assertRaisesRegex(DecodeError, "expected 0 items, got 2"):
            decode(tuple[()], [1, 2])
        self.assertEqual(schema_of(typing.Tuple), {"type": "array"})

    def test_an_enum_decodes_from_the_json_form_its_schema_lists(self):
        self.assertIs(decode(Pair, [1, 1]), Pair.UNIT)
        self.assertEqual(schema_of(Pair)["enum"], [[0, 0], [1, 1]])
        self.assertIs(decode(Flag, 1.0), Flag.ON)
        self.assertEqual(schema_of(Digit), {"enum": [1, 2], "type": "integer"})
        self.assertEqual(schema_of(Word), {"enum": ["w"], "type": "string"})
        self.assertIs(decode(Digit, 2), Digit.TWO)
        self.assertIs(decode(Literal[Word.W], "w"), Word.W)
        for wrong in [[1, 1, 1], [1], True, "1"]:
            with self.subTest(wrong=wrong):
                with self.assertRaises(DecodeError):
                    decode(Pair if isinstance(wrong, list) else Flag, wrong)


class WitTest(unittest.TestCase):
    def test_the_sdks_copy_of_the_contract_is_the_repositorys(self):
        sdk = Path(__file__).resolve().parents[1] / "toolgate_sdk/wit/deps/plugin/plugin.wit"
        repo = Path(__file__).resolve().parents[3] / "wit/plugin.wit"
        self.assertEqual(sdk.read_bytes(), repo.read_bytes(), "copy wit/plugin.wit into the Python SDK")


if __name__ == "__main__":
    unittest.main()
