"""Typed results: a step's return value as JSON that loads back equal, or a clear refusal.

What hash_attrs accept, results accept — dataclasses, pydantic models, enums, paths,
datetimes, tuples, sets, string-keyed mappings — plus non-finite floats (a diverged loss).
`encode_result` checks the round trip when the step finishes, while its output is still
uncommitted: a result that would come back different (a tuple as a list, a datetime as a
string, an int-keyed dict with string keys) fails that step instead of silently changing what
every downstream step reads. `from_jsonable` is strict: JSON that does not fit the type raises.
numpy and JAX values are recognised by shape, without importing either: a scalar is recorded
as the number, an array is refused (return `.tolist()`).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import enum
import functools
import json
import math
import pathlib
import types
import typing
from collections import abc
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import Any

from marin_assets.core.identity import is_pydantic_model
from marin_assets.core.record_types import storage_name


class StepResultError(TypeError):
    """The step function returned a value that cannot be recorded (or would not load back equal)."""


def encode_result(step_name: str, result: Any) -> Any:
    """The JSON form of a step's result, checked to load back equal; `StepResultError` otherwise.

    The check runs now, while the step's output is still uncommitted, so that a result that
    would come back different (a tuple as a list, a datetime as a string) fails this step
    instead of silently changing what every downstream step reads.
    """
    try:
        data = to_jsonable(result)
        own_type = _own_type(result)
        try:
            loaded = from_jsonable(data, own_type)
        except (TypeError, ValueError) as e:
            raise TypeError(f"{e} (so it would not load back as {type_label(own_type)})") from None
        difference = _first_difference(result, loaded, "result")
    except RecursionError:
        raise StepResultError(f"step {step_name!r}: result is nested too deeply to record"
                              " (does it contain itself?)") from None
    except TypeError as e:
        raise StepResultError(f"step {step_name!r}: {e}") from None
    if difference is not None:
        raise StepResultError(f"step {step_name!r}: {difference}")
    return data


def to_jsonable(value: Any, where: str = "result") -> Any:
    """The JSON form of a step's result; `TypeError` naming the path of what has none.

    Accepts what `identity.canonical` accepts (dataclasses, pydantic models, enums, paths,
    datetimes, str-keyed mappings, sequences, sets in canonical order) and also non-finite
    floats, since a diverged loss is NaN. numpy/jax scalars become Python numbers; arrays with
    a shape are refused rather than guessed at.
    """
    kind = type(value)
    if value is None or kind is str or kind is int or kind is float or kind is bool:
        return value
    if isinstance(value, enum.Enum):  # before int and str: IntEnum is an int, StrEnum a str
        return to_jsonable(value.value, f"{where}.value")
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):  # np.float64 too
        return float(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, pathlib.PurePath):
        return value.as_posix()
    if isinstance(value, (_dt.datetime, _dt.date, _dt.time)):
        return value.isoformat()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_jsonable(getattr(value, f.name), f"{where}.{f.name}") for f in dataclasses.fields(value)}
    if is_pydantic_model(value):
        return {name: to_jsonable(getattr(value, name), f"{where}.{name}") for name in type(value).model_fields}
    shape = _array_shape(value)
    if shape == ():
        return to_jsonable(value.item(), where)
    if shape is not None:
        raise TypeError(f"{where} is an array of shape {shape} ({getattr(value, 'dtype', '?')}); return"
                        " .tolist() for its values (or .item() for one number)")
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for key, item in value.items():
            name = key.value if isinstance(key, enum.Enum) else key
            if not isinstance(name, str):
                raise TypeError(f"{where} has a key {key!r} of type {type(key).__name__}; keys must be strings, as in"
                                f" hash_attrs (JSON would record it as {str(name)!r} and load it back as a string)")
            out[str(name)] = to_jsonable(item, f"{where}[{name!r}]")
        return out
    if isinstance(value, AbstractSet):
        return sorted((to_jsonable(item, f"{where}{{…}}") for item in value), key=_dumps)
    if isinstance(value, Sequence) and not isinstance(value, (bytes, bytearray)):
        return [to_jsonable(item, f"{where}[{i}]") for i, item in enumerate(value)]
    if callable(value):
        raise TypeError(f"{where} is a callable ({_qualified(value)}), which cannot be recorded")
    raise TypeError(f"{where} is of type {_qualified(kind)}, which cannot be recorded; return a dataclass,"
                    " pydantic model, enum, path, datetime or plain JSON value")


def type_name(value: Any) -> str | None:
    """How a record names the result's type: the stable name it declares (`core/record_types.py`), else
    `module:qualname`; None when its JSON is the value (numbers, text, list, dict)."""
    tp = _own_type(value)
    if tp in (type(None), bool, int, float, str, list, dict):
        return None
    return storage_name(tp) or f"{tp.__module__}:{tp.__qualname__}"


def _own_type(value: Any) -> Any:
    """The type a result loads back as: a numpy scalar or a `str` subclass is recorded as the plain value."""
    if not _is_plain_json(value) and not _is_record(value) and _array_shape(value) == ():
        value = value.item()
    if isinstance(value, enum.Enum):
        return type(value)
    for plain in (bool, int, float, str):
        if isinstance(value, plain):
            return plain
    return type(value)


def from_jsonable(data: Any, tp: Any, where: str = "result") -> Any:
    """Rebuild a value of type `tp` from `to_jsonable`'s output.

    Raises `TypeError`/`ValueError` naming the path where the JSON does not fit the type,
    rather than return data of another type. Dataclass fields absent from the record take
    their defaults, so records made before a field was added still load.
    """
    if tp is Any or tp is object or isinstance(tp, typing.TypeVar):
        return data
    if tp is None or tp is type(None):
        if data is None:
            return None
        raise TypeError(f"{where}: expected None, got {_describe(data)}")
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Annotated:
        return from_jsonable(data, args[0], where)
    if hasattr(tp, "__supertype__"):  # typing.NewType
        return from_jsonable(data, tp.__supertype__, where)
    if origin in (typing.Union, types.UnionType):
        return _from_union(data, tp, args, where)
    if origin is typing.Literal:
        if any(type(data) is type(a) and data == a for a in args):
            return data
        raise ValueError(f"{where}: expected one of {list(args)}, got {_describe(data)}")
    container = origin if origin is not None else tp
    if not isinstance(container, type):
        raise TypeError(f"{where}: cannot rebuild a value of type {type_label(tp)}")
    if container in _SCALARS:
        return _from_scalar(data, container, where)
    if container in _LISTS or container is tuple:
        return _from_sequence(data, container, args, where)
    if container in _SETS:
        _expect(data, list, "a list", where)
        item_t = args[0] if args else Any
        items = [from_jsonable(v, item_t, f"{where}{{…}}") for v in data]
        try:
            return _SETS[container](items)
        except TypeError as e:
            raise TypeError(f"{where}: the items of {type_label(tp)} cannot be put in a set ({e})") from None
    if container in _MAPPINGS:
        _expect(data, dict, "an object", where)
        key_t, val_t = args if len(args) == 2 else (Any, Any)
        return {from_jsonable(k, key_t, f"{where} key {k!r}"): from_jsonable(v, val_t, f"{where}[{k!r}]")
                for k, v in data.items()}
    if dataclasses.is_dataclass(container):
        return _from_dataclass(data, container, where)
    if hasattr(container, "model_validate") and hasattr(container, "model_fields"):
        return _from_pydantic(data, container, where)
    if issubclass(container, enum.Enum):
        return _from_enum(data, container, where)
    if issubclass(container, pathlib.PurePath):
        _expect(data, str, "a string", where)
        return container(data)
    if issubclass(container, (_dt.datetime, _dt.date, _dt.time)):  # datetime is a date: exact class wins
        _expect(data, str, "an ISO string", where)
        try:
            return container.fromisoformat(data)
        except ValueError:
            raise ValueError(f"{where}: {data!r} is not an ISO {container.__name__}") from None
    if issubclass(container, tuple) and hasattr(container, "_fields"):  # NamedTuple
        _expect(data, list, "a list", where)
        hints = _field_hints(container, where)
        if len(data) != len(container._fields):
            raise ValueError(f"{where}: expected {len(container._fields)} items for {container.__qualname__},"
                             f" got {len(data)}")
        return container(*(from_jsonable(v, hints.get(f, Any), f"{where}.{f}")
                           for v, f in zip(data, container._fields, strict=True)))
    if isinstance(data, container):
        return data
    raise TypeError(f"{where}: cannot rebuild a {_qualified(container)} from {_describe(data)}")


_SCALARS: dict[type, tuple[type, ...]] = {bool: (bool,), int: (int,), float: (int, float), str: (str,)}
_LISTS = {list, abc.Sequence, abc.MutableSequence, abc.Iterable, abc.Collection}
_SETS: dict[Any, type] = {set: set, frozenset: frozenset, abc.Set: set, abc.MutableSet: set}
_MAPPINGS = {dict, abc.Mapping, abc.MutableMapping}


def _from_scalar(data: Any, tp: type, where: str) -> Any:
    """Exact JSON types: a str is not an int, a bool is not an int, an int is a float (PEP 484)."""
    if isinstance(data, _SCALARS[tp]) and (tp is bool or not isinstance(data, bool)):
        return data
    raise TypeError(f"{where}: expected {tp.__name__}, got {_describe(data)}")


def _from_union(data: Any, tp: Any, args: tuple[Any, ...], where: str) -> Any:
    """The first member the JSON fits, in the order written; an error if none does."""
    if data is None and type(None) in args:
        return None
    problems = []
    for arg in args:
        if arg is type(None):
            continue
        try:
            return from_jsonable(data, arg, where)
        except (TypeError, ValueError) as e:
            problems.append(str(e).removeprefix(f"{where}: "))
    raise TypeError(f"{where}: {_describe(data)} fits no member of {type_label(tp)} ({'; '.join(problems)})")


def _from_sequence(data: Any, container: type, args: tuple[Any, ...], where: str) -> Any:
    _expect(data, list, "a list", where)
    if container is tuple and args and args[-1] is not Ellipsis:
        if args == ((),):  # tuple[()]
            args = ()
        if len(data) != len(args):
            raise ValueError(f"{where}: expected {len(args)} items for tuple[{', '.join(map(type_label, args))}],"
                             f" got {len(data)}")
        return tuple(from_jsonable(v, a, f"{where}[{i}]") for i, (v, a) in enumerate(zip(data, args, strict=True)))
    item_t = args[0] if args else Any
    items = [from_jsonable(v, item_t, f"{where}[{i}]") for i, v in enumerate(data)]
    return tuple(items) if container is tuple else items


def _from_dataclass(data: Any, tp: type, where: str) -> Any:
    """Fields the class has and the record lacks take their defaults; unknown fields are an error."""
    _expect(data, dict, f"a {tp.__qualname__} record (an object)", where)
    data = _renamed_fields(data, tp)
    fields = dataclasses.fields(tp)
    unknown = sorted(set(data) - {f.name for f in fields})
    if unknown:
        raise ValueError(f"{where}: the record has field(s) {', '.join(map(repr, unknown))}"
                         f" that {tp.__qualname__} does not have")
    hints = _field_hints(tp, where)
    kwargs: dict[str, Any] = {}
    for f in fields:
        if not f.init:
            continue
        if f.name in data:
            kwargs[f.name] = from_jsonable(data[f.name], hints.get(f.name, Any), f"{where}.{f.name}")
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ValueError(f"{where}: the record lacks {tp.__qualname__}'s field {f.name!r}, which has no default")
    try:
        return tp(**kwargs)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{where}: {tp.__qualname__} refused the recorded values: {e}") from None


def _renamed_fields(data: dict[str, Any], tp: type) -> dict[str, Any]:
    """A record made before a field was renamed: `tp.__renamed_fields__` maps old names to new; an old field's
    value fills the new one (a None never hides one given under another old name)."""
    renamed: dict[str, str] = getattr(tp, "__renamed_fields__", {})
    if not renamed or not set(renamed) & set(data):
        return data
    data = dict(data)
    for old, new in renamed.items():
        if old in data:
            value = data.pop(old)
            if value is not None or new not in data:
                data[new] = value
    return data


def _from_pydantic(data: Any, tp: Any, where: str) -> Any:
    """The model validates its own fields; keys it does not know are an error unless it allows extras."""
    _expect(data, dict, f"a {tp.__qualname__} record (an object)", where)
    if tp.model_config.get("extra") != "allow":
        known = set(tp.model_fields) | {f.alias for f in tp.model_fields.values() if f.alias}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"{where}: the record has field(s) {', '.join(map(repr, unknown))}"
                             f" that {tp.__qualname__} does not have")
    try:
        return tp.model_validate(data)
    except ValueError as e:  # pydantic's ValidationError
        raise ValueError(f"{where}: {tp.__qualname__} refused the recorded values: {e}") from None


def _from_enum(data: Any, tp: type[enum.Enum], where: str) -> Any:
    try:
        return tp(data)
    except (TypeError, ValueError):
        for member in tp:  # values whose JSON differs from themselves, e.g. tuples
            if _dumps(to_jsonable(member.value)) == _dumps(data):
                return member
    raise ValueError(f"{where}: {_describe(data)} is not a value of {tp.__qualname__}")


def _first_difference(original: Any, loaded: Any, where: str) -> str | None:
    """How `loaded` differs from `original` at the first path where it does; None when equal.

    Stricter than `==`: a tuple loaded as a list, or a datetime as a string, is a difference
    (it would break the code that reads it). NaN equals NaN; a numpy scalar equals its `.item()`.
    """
    if not _is_plain_json(original) and _array_shape(original) == () and not _is_record(original):
        original = original.item()
    if not _same_kind(original, loaded):
        if not _is_plain_json(loaded):
            hint = "annotate the field with its exact type (in a Union, the first type that fits wins)"
        elif "." in where:
            hint = "annotate the field with its type"
        else:
            hint = "a bare list, tuple, set or dict records no item types: return a dataclass with typed fields"
        return f"{where} would load back as {type_label(type(loaded))}, not {type_label(type(original))}: {hint}"
    if dataclasses.is_dataclass(original) and not isinstance(original, type):
        for f in dataclasses.fields(original):
            found = _first_difference(getattr(original, f.name), getattr(loaded, f.name), f"{where}.{f.name}")
            if found is not None:
                return found
        return None
    if is_pydantic_model(original):
        for name in type(original).model_fields:
            found = _first_difference(getattr(original, name), getattr(loaded, name), f"{where}.{name}")
            if found is not None:
                return found
        return None
    if isinstance(original, Mapping):
        by_name = {(k.value if isinstance(k, enum.Enum) else k): (k, v) for k, v in loaded.items()}
        if len(by_name) != len(original):
            return f"{where} would load back with {len(by_name)} key(s), not {len(original)}"
        for key, item in original.items():
            name = key.value if isinstance(key, enum.Enum) else key
            if name not in by_name:
                return f"{where} would load back without the key {key!r}"
            loaded_key, loaded_item = by_name[name]
            found = (_first_difference(key, loaded_key, f"{where} key {key!r}")
                     or _first_difference(item, loaded_item, f"{where}[{name!r}]"))
            if found is not None:
                return found
        return None
    if isinstance(original, AbstractSet):
        return _sequence_difference(sorted(original, key=_encoded), sorted(loaded, key=_encoded), f"{where}{{…}}",
                                    where)
    if isinstance(original, (list, tuple)):
        return _sequence_difference(list(original), list(loaded), None, where)
    if isinstance(original, float) and isinstance(loaded, float) and math.isnan(original) and math.isnan(loaded):
        return None
    if isinstance(original, pathlib.PurePath):
        equal = original.as_posix() == loaded.as_posix()
    else:
        equal = bool(original == loaded)
    return None if equal else f"{where} would load back as {_short(loaded)}, not {_short(original)}"


def _sequence_difference(original: list[Any], loaded: list[Any], item_where: str | None, where: str) -> str | None:
    if len(original) != len(loaded):
        return f"{where} would load back with {len(loaded)} item(s), not {len(original)}"
    for i, (a, b) in enumerate(zip(original, loaded, strict=True)):
        found = _first_difference(a, b, item_where or f"{where}[{i}]")
        if found is not None:
            return found
    return None


def _same_kind(original: Any, loaded: Any) -> bool:
    """Whether `loaded` has the type code reading `original` relies on."""
    if original is None:
        return loaded is None
    if isinstance(original, enum.Enum):  # before bool, int and str
        return type(loaded) is type(original)
    if isinstance(original, bool):
        return type(loaded) is bool
    if isinstance(original, (int, float)):
        return isinstance(loaded, (int, float)) and not isinstance(loaded, (bool, enum.Enum))
    if isinstance(original, str):
        return type(loaded) is str
    if isinstance(original, pathlib.PurePath):
        return isinstance(loaded, pathlib.PurePath)
    if isinstance(original, Mapping):
        return isinstance(loaded, Mapping)  # any mapping loads back as a dict, which compares equal
    return type(loaded) is type(original)


def _is_record(value: Any) -> bool:
    """A dataclass instance or pydantic model: recorded field by field."""
    return (dataclasses.is_dataclass(value) and not isinstance(value, type)) or is_pydantic_model(value)


def _is_plain_json(value: Any) -> bool:
    return value is None or type(value) in (bool, int, float, str, list, dict)


def _array_shape(value: Any) -> tuple[int, ...] | None:
    """The shape of a numpy/jax (or similar) array or scalar; None for anything else."""
    shape = getattr(value, "shape", None)
    if isinstance(shape, tuple) and hasattr(value, "dtype") and callable(getattr(value, "item", None)):
        return shape
    return None


def _field_hints(tp: type, where: str) -> dict[str, Any]:
    try:
        return _cached_hints(tp)
    except (NameError, AttributeError, TypeError, SyntaxError) as e:  # a string annotation that does not resolve
        raise TypeError(f"{where}: cannot resolve the field types of {tp.__qualname__} ({type(e).__name__}: {e})"
                        ) from None


@functools.lru_cache(maxsize=256)
def _cached_hints(tp: type) -> dict[str, Any]:
    return typing.get_type_hints(tp)


def _expect(data: Any, kind: type, what: str, where: str) -> None:
    if not isinstance(data, kind):
        raise TypeError(f"{where}: expected {what}, got {_describe(data)}")


def _dumps(value: Any) -> str:
    """Canonical JSON text (NaN allowed), the sort key of set items."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _encoded(value: Any) -> str:
    return _dumps(to_jsonable(value))


def _describe(data: Any) -> str:
    """A JSON value for an error message: its JSON type and a short repr."""
    names = {type(None): "null", bool: "bool", int: "int", float: "float", str: "str", list: "list", dict: "object"}
    return f"{names.get(type(data), type(data).__name__)} {_short(data)}"


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def type_label(tp: Any) -> str:
    """A type as a person reads it in an error: `Point`, `list[int]`, `Optional[str]`."""
    if isinstance(tp, type) and not typing.get_args(tp):
        return "None" if tp is type(None) else tp.__qualname__
    return repr(tp).replace("typing.", "").replace("NoneType", "None")


def _qualified(value: Any) -> str:
    """`module.qualname` of a type or function (just the name for builtins)."""
    name = getattr(value, "__qualname__", None) or type(value).__qualname__
    module = getattr(value, "__module__", None)
    return name if module in (None, "builtins") else f"{module}.{name}"
