"""Native tests of the Python SDK: the schema the model sees is derived from
the same type hints that decode the arguments, and the raw adapter keeps the
error model. Run: `python -m unittest discover -s guest-sdk/python/tests`."""

import enum
import json
import sys
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


class WitTest(unittest.TestCase):
    def test_the_sdks_copy_of_the_contract_is_the_repositorys(self):
        sdk = Path(__file__).resolve().parents[1] / "toolgate_sdk/wit/deps/plugin/plugin.wit"
        repo = Path(__file__).resolve().parents[3] / "wit/plugin.wit"
        self.assertEqual(sdk.read_bytes(), repo.read_bytes(), "copy wit/plugin.wit into the Python SDK")


if __name__ == "__main__":
    unittest.main()
