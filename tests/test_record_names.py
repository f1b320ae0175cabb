"""Records name their result's type by a declared, stable name (`core/record_types.py`), not by the module that
defines it: a move or rename of the class leaves every record readable. Records written before the names (by
`module:qualname`, in the current layout, the stored outputs of the previous release, or the `MOVED_TYPES`
layout before it) still load."""

from __future__ import annotations

import dataclasses
import datetime
import enum
import functools
import importlib
import json
import pathlib
import re
import shutil
import subprocess
import sys
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

import marin_assets.steps  # noqa: F401  (declares every result type a shipped step returns)
from marin_assets import Step, materialize_step
from marin_assets.core import record_types
from marin_assets.core.record import RECORD_FILE, load_result, read_record, resolve_type
from marin_assets.core.record_types import RecordTypeError, record_type, registered_names, storage_name
from marin_assets.core.results import to_jsonable, type_name
from marin_assets.core.step import walk
from marin_assets.pipeline import MOVED_TYPES
from tests.support.helpers import FAST, ROOT, subprocess_env

OLD_OUTPUTS = pathlib.Path(__file__).parent / "data" / "levanter-1.2.dev1644"
NAMES = registered_names()


@pytest.fixture
def scratch_registry(monkeypatch):
    """The registry as it is, on copies: what a test declares is gone after it."""
    monkeypatch.setattr(record_types, "_types", dict(record_types._types))
    monkeypatch.setattr(record_types, "_names", dict(record_types._names))


def example(tp: Any, where: str = "result") -> Any:
    """A value of type `tp` with every field filled (defaults left as they are): enough to round-trip."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any or tp is type(None):
        return None
    if origin in (typing.Union, types.UnionType):
        chosen = [a for a in args if a is not type(None)]
        return example(chosen[0], where) if chosen else None
    if origin is typing.Literal:
        return args[0]
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        hints = typing.get_type_hints(tp)
        return tp(**{f.name: example(hints[f.name], f"{where}.{f.name}") for f in dataclasses.fields(tp)
                     if f.init and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING})
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return next(iter(tp))
    simple = {bool: True, int: 3, float: 0.5, str: "x", pathlib.Path: pathlib.Path("/x"),
              datetime.datetime: datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)}
    if tp in simple:
        return simple[tp]
    if origin is tuple:
        return tuple(example(a, where) for a in args if a is not Ellipsis)
    if origin in (list, Sequence) or tp is list:
        return [example(args[0], where)] if args else []
    if origin in (set, frozenset):
        return origin([example(args[0], where)])
    if origin in (dict, Mapping) or tp is dict:
        return {"k": example(args[1], where)} if args else {}
    raise AssertionError(f"{where}: no example for {tp!r}; teach `example` this type")


def materialized(tmp_path: pathlib.Path, name: str, value: Any) -> str:
    step = Step(name=f"records/{name}", fn=lambda out: value, hash_attrs={"name": name})
    return materialize_step(step, prefix=str(tmp_path), settings=FAST).output_path


def rewrite_type(output_path: str, result_type: str) -> None:
    """The record as a version that named the type `result_type` wrote it; the rest of it as it was."""
    path = pathlib.Path(output_path) / RECORD_FILE
    raw = json.loads(path.read_text())
    raw["result_type"] = result_type
    path.write_text(json.dumps(raw, indent=2, sort_keys=True))


def test_the_registry_holds_every_result_type_under_a_short_unique_name():
    assert len(NAMES) >= 34
    assert all(re.fullmatch(r"[a-z][a-z0-9_]*", name) and len(name) <= 32 for name in NAMES), sorted(NAMES)
    assert len(set(NAMES.values())) == len(NAMES)
    assert NAMES["train_result"].__qualname__ == "TrainResult"


@pytest.mark.parametrize("name", sorted(NAMES))
def test_every_registered_type_round_trips_through_a_record(tmp_path, name):
    tp = NAMES[name]
    value = example(tp)
    assert storage_name(tp) == name and type_name(value) == name
    out = materialized(tmp_path, name, value)
    raw = json.loads((pathlib.Path(out) / RECORD_FILE).read_text())
    assert raw["result_type"] == name, "a new record names the type by its storage name"
    loaded = load_result(out)
    assert type(loaded) is tp and loaded == value


RECORD_KEYS = {"name", "hash", "hash_attrs", "deps", "output_path", "result", "result_type", "provenance",
               "duration_s", "version", "content_version", "input_versions", "startup_s", "prediction"}
"""A record's keys as they were before storage names: only `result_type`'s value changed."""


def test_a_record_changes_only_in_its_type_field(tmp_path):
    value = example(NAMES["hello_stats"])
    raw = json.loads((pathlib.Path(materialized(tmp_path, "hello_stats", value)) / RECORD_FILE).read_text())
    assert set(raw) == RECORD_KEYS
    assert raw["result"] == to_jsonable(value), "the result's JSON holds no type tag"
    assert raw["result_type"] == "hello_stats"
    for old in OLD_OUTPUTS.rglob(RECORD_FILE):
        assert set(json.loads(old.read_text())) <= RECORD_KEYS, old


@pytest.mark.parametrize("name", sorted(NAMES))
def test_a_record_naming_the_current_module_path_loads(tmp_path, name):
    tp = NAMES[name]
    value = example(tp)
    out = materialized(tmp_path, name, value)
    rewrite_type(out, f"{tp.__module__}:{tp.__qualname__}")  # as every record before storage names did
    assert load_result(out) == value and type(load_result(out)) is tp


MOVED_RESULTS = sorted(old for old, new in MOVED_TYPES.items() if resolve_type(new) in set(NAMES.values()))


def test_moved_types_include_result_types():
    assert "marin_assets.pipeline.train:TrainResult" in MOVED_RESULTS
    assert len(MOVED_RESULTS) >= 5


@pytest.mark.parametrize("old", MOVED_RESULTS)
def test_a_record_naming_a_module_path_from_before_the_wings_loads(tmp_path, old):
    tp = resolve_type(MOVED_TYPES[old])
    value = example(tp)
    out = materialized(tmp_path, storage_name(tp) or "x", value)
    rewrite_type(out, old)
    loaded = load_result(out)
    assert type(loaded) is tp and loaded == value


def test_the_stored_outputs_of_the_previous_release_load_as_their_types(tmp_path):
    records = sorted(OLD_OUTPUTS.rglob(RECORD_FILE))
    assert len(records) == 4
    seen = set()
    for record in records:
        there = tmp_path / record.parent.relative_to(OLD_OUTPUTS)
        there.mkdir(parents=True)
        for name in (RECORD_FILE, ".status.json"):
            shutil.copy(record.parent / name, there / name)
        named = read_record(str(there)).result_type
        assert named and ":" in named, "written before storage names"
        loaded = load_result(str(there))
        assert type(loaded) is resolve_type(named)
        seen.add(storage_name(type(loaded)))
    assert seen == {"corpus_files", "tokenizer_info", "tokenized_cache", "train_result"}


def test_an_unknown_name_says_which_record_and_which_name(tmp_path):
    out = materialized(tmp_path, "hello_numbers", example(NAMES["hello_numbers"]))
    rewrite_type(out, "no_such_result")
    with pytest.raises(RecordTypeError, match=rf"{re.escape(out)}/\.artifact\.json.*'no_such_result'"):
        load_result(out)
    rewrite_type(out, "marin_assets.pipeline.never_was:Thing")
    with pytest.raises(RecordTypeError, match=r"\.artifact\.json.*'marin_assets\.pipeline\.never_was:Thing'"):
        load_result(out)
    assert load_result(out, NAMES["hello_numbers"]) == example(NAMES["hello_numbers"]), "a given type needs no name"


def test_a_name_declared_twice_is_an_error_naming_both_classes(scratch_registry):
    @record_type("test_twice")
    class First:
        pass

    class Second:
        pass

    with pytest.raises(RecordTypeError, match=r"'test_twice'.*First.*Second"):
        record_type("test_twice")(Second)
    with pytest.raises(RecordTypeError, match=r"'train_result'.*TrainResult.*Second"):
        record_type("test_other", old_names=("train_result",))(Second)
    with pytest.raises(RecordTypeError, match=r"First.*already recorded as 'test_twice'"):
        record_type("test_renamed")(First)
    assert record_types.registered_type("test_twice") is First and storage_name(Second) is None
    for bad in ("TrainResult", "train-result", "a:b", "", "_x"):
        with pytest.raises(RecordTypeError, match="snake_case"):
            record_type(bad)


def test_old_names_and_old_paths_load_as_the_type(scratch_registry):
    @record_type("test_new", old_names=("test_old", "tests.gone_module:Renamed"))
    @dataclasses.dataclass(frozen=True)
    class Renamed:
        x: int

    assert storage_name(Renamed) == "test_new"
    assert resolve_type("test_new") is resolve_type("test_old") is resolve_type("tests.gone_module:Renamed") is Renamed
    assert "test_old" not in registered_names()


def test_a_subclass_is_not_recorded_under_its_parents_name(scratch_registry):
    parent = NAMES["curation_result"]

    @dataclasses.dataclass(frozen=True)
    class Unregistered(parent):  # type: ignore[misc, valid-type]
        pass

    assert storage_name(Unregistered) is None
    assert type_name(example(Unregistered)) == f"{__name__}:{Unregistered.__qualname__}"


def test_a_name_resolves_in_a_process_that_has_not_imported_its_module():
    code = ("import json, sys\n"
            "from marin_assets.core.record import resolve_type\n"
            "assert 'marin_assets.pipeline' not in sys.modules, sorted(m for m in sys.modules if 'pipeline' in m)\n"
            "print(json.dumps({n: f'{t.__module__}:{t.__qualname__}' for n in json.loads(sys.argv[1])"
            " for t in [resolve_type(n)]}))\n")
    expected = {name: f"{tp.__module__}:{tp.__qualname__}" for name, tp in NAMES.items()}
    done = subprocess.run([sys.executable, "-c", code, json.dumps(sorted(NAMES))], cwd=ROOT, env=subprocess_env(),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == expected


# Every step the shipped experiments define returns a registered type (or plain JSON).

def shipped_steps() -> list[Step]:
    """The steps of the definitions and experiments, as `tests/support/identities.py` finds them."""
    from marin_assets import definitions
    from marin_assets.experiments import curated_docs, tiny_stories

    roots = [*definitions.steps, *curated_docs.steps, *tiny_stories.build().values()]
    roots += [family.step(50) for family in definitions.per_checkpoint]
    return walk(roots)


def made_by_function(step: Step) -> Any:
    """The function a step's description says made it (`made_by`), or None."""
    found = re.search(r"Made by `([\w.]+)`\.", step.description or "")
    if found is None:
        return None
    parts = found.group(1).split(".")
    for end in range(len(parts) - 1, 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:end]))
        except ModuleNotFoundError:
            continue
        for part in parts[end:]:
            obj = getattr(obj, part)
        return obj
    return None


def returned_type(step: Step) -> Any:
    """The return annotation of the step's function, or else of the function its description names."""
    fn = step.fn
    while isinstance(fn, functools.partial):
        fn = fn.func
    for candidate in (fn, made_by_function(step)):
        if isinstance(candidate, type):  # a curation filter (`made_by(type(chosen))`): what its stage records
            candidate = getattr(candidate, "result", None)
        if candidate is None:
            continue
        returned = typing.get_type_hints(candidate).get("return", Any)
        if returned is not Any:
            return returned
    return None


def plain_json(tp: Any) -> bool:
    return typing.get_origin(tp) in (dict, list) or tp in (str, int, float, bool, dict, list, type(None))


def test_every_result_type_a_shipped_step_returns_is_registered():
    steps = shipped_steps()
    typed = {step.name: returned_type(step) for step in steps}
    unregistered = {name: tp for name, tp in typed.items()
                    if tp is not None and not plain_json(tp) and storage_name(tp) is None}
    assert not unregistered, f"declare these with @record_type: {unregistered}"
    found = {tp for tp in typed.values() if tp is not None and not plain_json(tp)}
    assert len(found) >= 20, found
    unknown = sorted(name for name, tp in typed.items() if tp is None)
    assert not unknown, f"steps whose result type could not be found: {unknown}"


def test_hello_world_records_storage_names(tmp_path):
    from marin_assets.experiments import hello_world

    for step in walk([hello_world.report]):
        materialize_step(step, prefix=str(tmp_path), settings=FAST)
    stored = {step.name: read_record(step.output_path_under(str(tmp_path))).result_type
              for step in walk([hello_world.report])}
    assert stored == {"hello/numbers": "hello_numbers", "hello/stats": "hello_stats", "hello/report": None}
    stats = load_result(hello_world.stats.output_path_under(str(tmp_path)))
    assert type(stats).__qualname__ == "Stats" and stats.count == 1000
