"""JSON Schema from Python type hints, and JSON values back into those types.

This module owns the one descriptor source of a Python Tool (DESIGN.md
invariant 5): the schema the model sees is derived from the same annotations
that decode the arguments, so the two cannot drift. It never runs a Tool and
never reaches the host.

Supported: ``str``, ``int``, ``float``, ``bool``, ``None``, ``typing.Any``,
``list[T]``, ``tuple[T, ...]``, ``dict[str, T]``, ``Optional[T]`` / ``T | None``,
unions, ``Literal[...]``, ``enum.Enum`` subclasses, dataclasses, ``TypedDict``,
and ``Annotated[T, "description"]`` / ``Annotated[T, Field(...)]``. Field
descriptions also come from an ``Attributes:`` (or ``Args:``) section of the
class docstring. Anything else is refused with a message naming the field.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import json
import types
import typing
from typing import Any

__all__ = ["Field", "SchemaError", "DecodeError", "schema_of", "decode", "encode"]

# Keywords `Field` may add to a schema; each maps to its JSON Schema spelling.
_KEYWORDS = {
    "minimum": "minimum",
    "maximum": "maximum",
    "exclusive_minimum": "exclusiveMinimum",
    "exclusive_maximum": "exclusiveMaximum",
    "min_length": "minLength",
    "max_length": "maxLength",
    "pattern": "pattern",
    "min_items": "minItems",
    "max_items": "maxItems",
    "format": "format",
}


class Field:
    """Extra schema for one field: ``Annotated[int, Field("How many.", minimum=1)]``.

    The host validates arguments against the schema before the Tool runs, so a
    bound written here is enforced before ``call`` is entered.
    """

    def __init__(self, description: str | None = None, **keywords: Any) -> None:
        unknown = sorted(set(keywords) - set(_KEYWORDS))
        if unknown:
            raise SchemaError(f"Field() does not know {', '.join(unknown)}; use one of {', '.join(sorted(_KEYWORDS))}")
        self.description = description
        self.keywords = {_KEYWORDS[k]: v for k, v in keywords.items()}


class SchemaError(TypeError):
    """A type has no JSON Schema; the message names the class and field."""


class DecodeError(ValueError):
    """A JSON value does not fit the type; ``path`` names where."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path or 'arguments'}: {message}")
        self.path = path


_NONE = type(None)


def _is_typed_dict(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, dict) and hasattr(tp, "__required_keys__")


def _is_record(tp: Any) -> bool:
    return (isinstance(tp, type) and dataclasses.is_dataclass(tp)) or _is_typed_dict(tp)


def _split_doc(cls: type) -> tuple[str | None, dict[str, str]]:
    """The class docstring's summary and its ``Attributes:``/``Args:`` entries."""
    # The class's own docstring only: an undocumented Enum must not inherit Enum's.
    own = cls.__dict__.get("__doc__")
    doc = inspect.cleandoc(own) if isinstance(own, str) else None
    if not doc or (dataclasses.is_dataclass(cls) and doc.startswith(cls.__name__ + "(")):
        return None, {}
    summary: list[str] = []
    fields: dict[str, str] = {}
    section = False
    current: str | None = None
    for line in doc.splitlines():
        stripped = line.strip()
        if stripped in ("Attributes:", "Args:", "Arguments:", "Fields:"):
            section, current = True, None
            continue
        if not section:
            summary.append(line)
            continue
        if not stripped:
            current = None
            continue
        indent = len(line) - len(line.lstrip())
        name, sep, text = stripped.partition(":")
        name = name.split("(")[0].strip()
        if sep and indent <= 4 and name.isidentifier():
            current = name
            fields[name] = text.strip()
        elif current is not None:
            fields[current] = (fields[current] + " " + stripped).strip()
        else:
            section = False
            summary.append(line)
    text = "\n".join(summary).strip()
    return (text or None), fields


def _hints(cls: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls, include_extras=True)
    except Exception as e:  # a forward reference that does not resolve
        raise SchemaError(f"cannot read the type hints of `{cls.__qualname__}`: {e}") from e


# PEP 655's key marks (Python 3.11+, or typing_extensions), where there are any.
def _marks(name: str) -> tuple[Any, ...]:
    found = [getattr(typing, name, None)]
    try:
        import typing_extensions

        found.append(getattr(typing_extensions, name, None))
    except ImportError:
        pass
    return tuple({id(m): m for m in found if m is not None}.values())


_REQUIRED = _marks("Required")
_NOT_REQUIRED = _marks("NotRequired")
_KEY_MARKS = _REQUIRED + _NOT_REQUIRED


def _key_mark(hint: Any) -> bool | None:
    """A TypedDict key's PEP 655 mark, read from its resolved hint (also under
    ``Annotated``): True for ``Required``, False for ``NotRequired``, else None."""
    while True:
        origin = typing.get_origin(hint)
        if origin in _REQUIRED:
            return True
        if origin in _NOT_REQUIRED:
            return False
        if origin is typing.Annotated:
            hint = typing.get_args(hint)[0]
        else:
            return None


def _unwrap(tp: Any) -> tuple[Any, list[Any]]:
    """``Annotated[T, m...]`` -> (T, [m...]); ``Required[T]`` and
    ``NotRequired[T]`` (a TypedDict's keys, PEP 655: `_fields` reads which
    keys are required, through `_key_mark`) -> T; anything else -> (tp, [])."""
    if typing.get_origin(tp) in _KEY_MARKS:
        return _unwrap(typing.get_args(tp)[0])
    if typing.get_origin(tp) is typing.Annotated:
        base, *meta = typing.get_args(tp)
        inner, more = _unwrap(base)
        return inner, more + meta
    return tp, []


def _apply(schema: dict[str, Any], meta: list[Any]) -> dict[str, Any]:
    for m in meta:
        if isinstance(m, str):
            schema["description"] = m
        elif isinstance(m, Field):
            if m.description:
                schema["description"] = m.description
            schema.update(m.keywords)
    return schema


def _json_form(value: Any) -> Any:
    """``value`` as JSON data (an Enum member as its value, a tuple as a
    list); TypeError or ValueError if it has none (NaN and infinities included)."""
    data = encode(value)
    json.dumps(data, allow_nan=False)
    return data


def _json_eq(a: Any, b: Any, strict: bool = False) -> bool:
    """Equality of two JSON values as JSON Schema's ``enum`` compares them:
    numbers by value (1.0 is 1; ``strict``: an integer is not a float), a
    boolean never a number, arrays and objects item by item."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b and (not strict or type(a) is type(b))
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_json_eq(x, y, strict) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_json_eq(a[k], b[k], strict) for k in a)
    return type(a) is type(b) and a == b


def _enum_schema(values: list[Any]) -> dict[str, Any]:
    schema: dict[str, Any] = {"enum": values}
    kinds = {type(v) for v in values}
    if kinds == {str}:
        schema["type"] = "string"
    elif kinds == {int}:
        schema["type"] = "integer"
    elif kinds == {bool}:
        schema["type"] = "boolean"
    return schema


def schema_of(tp: Any, where: str = "") -> dict[str, Any]:
    """The JSON Schema (draft 2020-12, inlined, no ``$ref``) of ``tp``."""
    return _schema(tp, where or _name(tp), ())


def _name(tp: Any) -> str:
    return getattr(tp, "__qualname__", None) or repr(tp)


def _schema(tp: Any, where: str, seen: tuple[type, ...]) -> dict[str, Any]:
    tp, meta = _unwrap(tp)
    return _apply(_bare_schema(tp, where, seen), meta)


def _bare_schema(tp: Any, where: str, seen: tuple[type, ...]) -> dict[str, Any]:
    if tp is Any:
        return {}
    if tp is _NONE or tp is None:
        return {"type": "null"}
    if tp is bool:
        return {"type": "boolean"}
    if tp is int:
        return {"type": "integer"}
    if tp is float:
        return {"type": "number"}
    if tp is str:
        return {"type": "string"}
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        # The JSON form of each value (a tuple is an array): what decode compares.
        schema = _enum_schema([_literal_json(m, where) for m in tp])
        summary, _ = _split_doc(tp)
        if summary:
            schema["description"] = summary
        return schema
    if _is_record(tp):
        return _record_schema(tp, where, seen)
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Literal:
        # An Enum member is listed as its value; decode hands back the member.
        return _enum_schema([_literal_json(a, where) for a in args])
    if origin in (list, typing.List, set, frozenset) or tp in (list,):
        if origin in (set, frozenset):
            raise SchemaError(f"{where}: a set has no JSON form; use list[...]")
        item = args[0] if args else Any
        return {"type": "array", "items": _schema(item, where + "[]", seen)}
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return {"type": "array", "items": _schema(args[0], where + "[]", seen)}
        if tp is typing.Tuple:  # bare: any array
            return {"type": "array"}
        if not args or args == ((),):  # tuple[()] (`Tuple[()]` is `((),)` on 3.10): the empty array only
            return {"type": "array", "maxItems": 0}
        items = [_schema(a, f"{where}[{i}]", seen) for i, a in enumerate(args)]
        return {"type": "array", "prefixItems": items, "items": False, "minItems": len(items)}
    if origin is dict or tp is dict:
        key, value = (args + (Any, Any))[:2] if args else (str, Any)
        if key is not str:
            raise SchemaError(f"{where}: JSON object keys are strings; use dict[str, ...]")
        return {"type": "object", "additionalProperties": _schema(value, where + "{}", seen)}
    if origin in (typing.Union, types.UnionType):
        members = list(args)
        nullable = _NONE in members
        rest = [m for m in members if m is not _NONE]
        if len(rest) == 1:
            inner = _schema(rest[0], where, seen)
            if nullable:
                t = inner.get("type")
                if isinstance(t, str) and set(inner) <= {"type", "description", "format", "minimum", "maximum",
                                                         "minLength", "maxLength", "pattern"}:
                    inner = dict(inner, type=[t, "null"])
                else:
                    inner = {"anyOf": [inner, {"type": "null"}]}
            return inner
        options = [_schema(m, where, seen) for m in rest]
        if nullable:
            options.append({"type": "null"})
        return {"anyOf": options}
    raise SchemaError(
        f"{where}: type `{tp!r}` has no JSON Schema; use str, int, float, bool, list, dict[str, ...], "
        "Optional, Literal, an Enum, a dataclass or a TypedDict"
    )


def _literal_json(value: Any, where: str) -> Any:
    """The JSON form of a ``Literal`` value or an Enum member, or a SchemaError naming ``where``."""
    try:
        return _json_form(value)
    except (TypeError, ValueError) as e:
        raise SchemaError(f"{where}: `{value!r}` has no JSON form ({e})") from None


def _fields(tp: type) -> list[tuple[str, Any, bool, Any]]:
    """(name, type hint, required, default) of a dataclass or TypedDict."""
    hints = _hints(tp)
    out = []
    if dataclasses.is_dataclass(tp):
        for f in dataclasses.fields(tp):
            if not f.init:
                continue
            has_default = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
            default = f.default if f.default is not dataclasses.MISSING else dataclasses.MISSING
            hint = hints.get(f.name, Any)
            desc = f.metadata.get("description") if f.metadata else None
            if desc:
                hint = typing.Annotated[hint, str(desc)]
            out.append((f.name, hint, not has_default, default))
    else:
        # The key's own mark first: under `from __future__ import annotations`
        # `__required_keys__` misses `NotRequired`/`Required` written as
        # strings (python/cpython#97727), the resolved hint keeps them.
        required = tp.__required_keys__
        for name, hint in hints.items():
            mark = _key_mark(hint)
            out.append((name, hint, name in required if mark is None else mark, dataclasses.MISSING))
    return out


def _record_schema(tp: type, where: str, seen: tuple[type, ...]) -> dict[str, Any]:
    if tp in seen:
        raise SchemaError(f"{where}: `{tp.__qualname__}` contains itself; recursive types are not supported")
    seen = seen + (tp,)
    summary, docs = _split_doc(tp)
    properties: dict[str, Any] = {}
    required: list[str] = []
    for name, hint, is_required, default in _fields(tp):
        prop = _schema(hint, f"{tp.__qualname__}.{name}", seen)
        # A field's own words beat its type's: Annotated, then the docstring.
        _, meta = _unwrap(hint)
        annotated = any(isinstance(m, str) or (isinstance(m, Field) and m.description) for m in meta)
        if name in docs and not annotated:
            prop["description"] = docs[name]
        if default is not dataclasses.MISSING:
            # A default with no JSON form (an object, NaN, an infinity) is left
            # out of the schema, not refused: `default` only informs the model,
            # the field stays optional, and the Python default still applies
            # when the key is absent. `limit: float = math.inf` is ordinary
            # Python an author should not have to rewrite.
            try:
                prop["default"] = _json_form(default)
            except (TypeError, ValueError):
                pass
        properties[name] = prop
        if is_required:
            required.append(name)
    schema: dict[str, Any] = {"type": "object", "title": tp.__name__}
    if summary:
        schema["description"] = summary
    schema["properties"] = properties
    if required:
        schema["required"] = required
    # Unknown fields are refused, as `deny_unknown_fields` does for Rust Tools.
    schema["additionalProperties"] = False
    return schema


def decode(tp: Any, value: Any, path: str = "") -> Any:
    """``value`` (parsed JSON) as an instance of ``tp``; raises ``DecodeError``."""
    return _decode(tp, value, path, False)


def _decode(tp: Any, value: Any, path: str, strict: bool) -> Any:
    """``decode``; ``strict``: no number changes kind (an integer is not a
    float, nor 2.0 an integer), how a union first looks for its exact member."""
    tp, _ = _unwrap(tp)
    if tp is Any:
        return value
    if tp is _NONE or tp is None:
        if value is not None:
            raise DecodeError(path, "expected null")
        return None
    if tp is bool:
        if not isinstance(value, bool):
            raise DecodeError(path, f"expected a boolean, got {_kind(value)}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer() and not strict:
                return int(value)
            raise DecodeError(path, f"expected an integer, got {_kind(value)}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (strict and isinstance(value, int)):
            raise DecodeError(path, f"expected a number, got {_kind(value)}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise DecodeError(path, f"expected a string, got {_kind(value)}")
        return value
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return _one_of(list(tp), value, path, strict)
    if _is_record(tp):
        if not isinstance(value, dict):
            raise DecodeError(path, f"expected an object, got {_kind(value)}")
        fields = _fields(tp)
        known = {f[0] for f in fields}
        unknown = sorted(set(value) - known)
        if unknown:
            raise DecodeError(path, f"unknown field `{unknown[0]}`, expected one of {sorted(known)}")
        kwargs = {}
        for name, hint, is_required, _ in fields:
            sub = f"{path}.{name}" if path else name
            if name in value:
                kwargs[name] = _decode(hint, value[name], sub, strict)
            elif is_required:
                raise DecodeError(path, f"missing field `{name}`")
        return tp(**kwargs)
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Literal:
        return _one_of(list(args), value, path, strict)
    if origin in (list, typing.List) or tp is list:
        if not isinstance(value, list):
            raise DecodeError(path, f"expected an array, got {_kind(value)}")
        item = args[0] if args else Any
        return [_decode(item, v, f"{path}[{i}]", strict) for i, v in enumerate(value)]
    if origin is tuple:
        if not isinstance(value, list):
            raise DecodeError(path, f"expected an array, got {_kind(value)}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_decode(args[0], v, f"{path}[{i}]", strict) for i, v in enumerate(value))
        if tp is typing.Tuple:  # bare: any array, as its schema says
            return tuple(value)
        if args == ((),):  # `Tuple[()]` on 3.10
            args = ()
        if len(value) != len(args):
            raise DecodeError(path, f"expected {len(args)} items, got {len(value)}")
        return tuple(_decode(a, v, f"{path}[{i}]", strict) for i, (a, v) in enumerate(zip(args, value)))
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise DecodeError(path, f"expected an object, got {_kind(value)}")
        item = args[1] if len(args) == 2 else Any
        return {k: _decode(item, v, f"{path}.{k}" if path else k, strict) for k, v in value.items()}
    if origin in (typing.Union, types.UnionType):
        if value is None and _NONE in args:
            return None
        # A member the value fits exactly first (`float | int` given 3 is 3,
        # not 3.0), then the first it fits by JSON Schema's number rules.
        members = [m for m in args if m is not _NONE]
        errors: list[str] = []
        for exact in (True,) if strict else (True, False):
            errors = []
            for member in members:
                try:
                    return _decode(member, value, path, exact)
                except DecodeError as e:
                    errors.append(str(e))
        raise DecodeError(path, f"fits none of the allowed types ({'; '.join(errors)})")
    raise DecodeError(path, f"type `{tp!r}` cannot be decoded")


def _one_of(options: list[Any], value: Any, path: str, strict: bool) -> Any:
    """The option (a Literal value or an Enum member) whose JSON form is
    ``value``, as the schema's ``enum`` compares them; the option itself is
    returned (``Literal[1]`` given 1.0 is 1, an Enum's value its member)."""
    forms = []
    for option in options:
        try:
            form = encode(option)
        except TypeError:
            continue  # no JSON form: schema_of refuses it, and no value matches it
        if _json_eq(form, value, strict):
            return option
        forms.append(form)
    raise DecodeError(path, f"expected one of {forms}, got {value!r}")


def encode(value: Any) -> Any:
    """A Tool's return value as plain JSON data (dataclasses, enums, tuples)."""
    # An Enum first: an IntEnum or a `str` Enum member is also an int or a
    # str, and its JSON form is the plain value.
    if isinstance(value, enum.Enum):
        return encode(value.value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        # The fields its schema lists (`_fields`: those `__init__` takes).
        return {f.name: encode(getattr(value, f.name)) for f in dataclasses.fields(value) if f.init}
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise TypeError(f"object keys must be strings, got {type(k).__name__}")
            out[k] = encode(v)
        return out
    if isinstance(value, (list, tuple)):
        return [encode(v) for v in value]
    raise TypeError(f"a {type(value).__name__} has no JSON form")


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__
