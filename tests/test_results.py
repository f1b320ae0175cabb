"""Typed step results: what is recorded loads back equal, or the step fails at record time with
an error naming the step and the path inside the result. A refused result leaves FAILED and
no record. Fast: no Ray, no Dagster."""

import dataclasses
import datetime as dt
import enum
import json
import math
import os
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
import pydantic
import pytest

from marin_assets.core.materialize import materialize_step
from marin_assets.core.record import RECORD_FILE, load_result
from marin_assets.core.results import StepResultError, from_jsonable
from marin_assets.core.status import Status
from marin_assets.core.step import Step
from marin_assets.core.stores import read_status
from marin_assets.pipeline.training.specs import ModelSpec
from marin_assets.pipeline.training.training_run import TrainResult
from tests.support.helpers import FAST


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


@dataclasses.dataclass(frozen=True)
class Point:
    x: int
    y: float


@dataclasses.dataclass(frozen=True)
class Run:
    when: dt.datetime
    day: dt.date
    at: dt.time
    color: Color
    level: Level
    where: Path
    tags: frozenset[str]
    pair: tuple[int, str]
    points: list[Point]
    by_name: dict[str, Point]
    by_color: dict[Color, int]
    best: Point | None = None
    loss: float = 0.0


@dataclasses.dataclass(frozen=True)
class Curve:
    loss: float
    losses: list[float]
    steps: int


@dataclasses.dataclass(frozen=True)
class Loose:
    items: list[int]
    anything: Any = None
    per_step: dict[Any, float] = dataclasses.field(default_factory=dict)
    maybe: int | None = None
    when: Any = None


@dataclasses.dataclass(frozen=True)
class Inner:
    y: Any


@dataclasses.dataclass(frozen=True)
class Outer:
    xs: list[Inner]


class Eval(pydantic.BaseModel):
    name: str
    when: dt.datetime
    shape: tuple[int, int]
    color: Color
    loss: float
    point: Point


WHEN = dt.datetime(2024, 5, 17, 13, 45, 7, 12345, tzinfo=dt.UTC)
RUN = Run(
    when=WHEN, day=dt.date(2024, 5, 17), at=dt.time(9, 30), color=Color.BLUE, level=Level.HIGH,
    where=Path("/data/run-1"), tags=frozenset({"b", "a", "c"}), pair=(3, "three"),
    points=[Point(1, 0.5), Point(2, 1.5)], by_name={"p": Point(0, 0.0)}, by_color={Color.RED: 1},
    best=Point(9, 9.5), loss=float("nan"),
)


def record_of(step: Step) -> str:
    return os.path.join(step.output_path, RECORD_FILE)


def materialized(name: str, value: Any) -> Step:
    step = Step(name=name, fn=lambda out: value)
    materialize_step(step, settings=FAST)
    return step


def same(a: Any, b: Any) -> bool:
    """`==` that also compares types (a tuple is not a list) and takes NaN as equal to NaN."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    if dataclasses.is_dataclass(a) or isinstance(a, pydantic.BaseModel):
        names = [f.name for f in dataclasses.fields(a)] if dataclasses.is_dataclass(a) else list(type(a).model_fields)
        return all(same(getattr(a, n), getattr(b, n)) for n in names)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(k, next(j for j in b if j == k)) and same(v, b[k])
                                            for k, v in a.items())
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, (set, frozenset)):
        return a == b and {type(x) for x in a} == {type(x) for x in b}
    return bool(a == b)


# ---------------------------------------------------------------- round trips

ROUND_TRIPS = {
    "datetimes_enums_paths_sets_tuples_optional_nan": RUN,
    "naive_datetime_alone": dataclasses.replace(RUN, when=dt.datetime(2020, 1, 1), best=None, loss=1.0),
    "nan_and_inf_losses": Curve(loss=float("nan"), losses=[2.5, float("inf"), float("nan")], steps=3),
    "pydantic_model": Eval(name="e", when=WHEN, shape=(2, 3), color=Color.RED, loss=float("nan"), point=Point(1, 2.0)),
    "plain_json": {"nested": {"xs": [1, 2.5, None, True, "s"]}},
    "top_level_tuple": (1, "a", 2.5),
    "top_level_set": {3, 1, 2},
    "none": None,
    "top_level_numpy_float": np.float32(0.5),
    "top_level_numpy_int": np.int64(3),
    "top_level_zero_d_array": np.array(2.5),
    "int_enum": Level.LOW,
}


@pytest.mark.parametrize("case", ROUND_TRIPS)
def test_a_result_loads_back_equal(prefix, case):
    value = ROUND_TRIPS[case]
    step = materialized(f"t/{case}", value)
    if hasattr(value, "dtype"):  # a numpy scalar loads back as the Python number
        value = value.item()
    assert same(load_result(step, type(value)), value)
    assert same(load_result(step), value)  # the type recorded at write time


def test_same_is_strict():
    assert same(RUN, dataclasses.replace(RUN)) and same(float("nan"), float("nan"))
    assert not same(RUN, dataclasses.replace(RUN, pair=[3, "three"]))
    assert not same({"a": (1,)}, {"a": [1]}) and not same({Color.RED: 1}, {"red": 1})


def test_datetimes_are_iso_strings_sets_are_sorted_and_nan_is_written(prefix):
    step = materialized("t/run", RUN)
    text = Path(record_of(step)).read_text()
    result = json.loads(text)["result"]
    assert result["when"] == "2024-05-17T13:45:07.012345+00:00" and result["day"] == "2024-05-17"
    assert result["at"] == "09:30:00" and result["tags"] == ["a", "b", "c"]
    assert result["by_color"] == {"red": 1} and result["where"] == "/data/run-1"
    assert math.isnan(result["loss"]) and "NaN" in text
    loaded = load_result(step, Run)
    assert loaded.when == WHEN and type(loaded.day) is dt.date and loaded.pair == (3, "three")
    assert loaded.by_color == {Color.RED: 1} and loaded.level is Level.HIGH and math.isnan(loaded.loss)


def test_numpy_scalars_are_recorded_as_python_numbers(prefix):
    value = Curve(loss=np.float32(0.5), losses=[np.float64(0.25), np.array(1.5), np.float32(np.nan)], steps=np.int64(3))
    step = materialized("t/np", value)
    result = json.loads(Path(record_of(step)).read_text())["result"]
    assert result["loss"] == 0.5 and result["losses"][:2] == [0.25, 1.5] and math.isnan(result["losses"][2])
    assert type(result["steps"]) is int and result["steps"] == 3
    assert same(load_result(step, Curve), Curve(0.5, [0.25, 1.5, float("nan")], 3))
    assert same(load_result(step), Curve(0.5, [0.25, 1.5, float("nan")], 3))


def test_a_record_without_fields_added_since_still_loads(prefix):
    """Records made before `TrainResult` gained `model` and `tokenizer` (defaults None)."""
    old = {"run_id": "r", "steps": 5, "final_train_loss": 2.0, "final_eval_loss": None, "eval_losses": {"a": 2.5},
           "tokens_per_second": None, "checkpoint_steps": [5], "checkpoint_dir": "/c", "hf_dir": None,
           "loss_curve": [[1, 3.0], [5, 2.0]]}
    step = materialized("t/old-train", old)
    loaded = load_result(step, TrainResult)
    assert loaded.model is None and loaded.tokenizer is None and loaded.loss_curve == [[1, 3.0], [5, 2.0]]
    new = dataclasses.replace(loaded, model=ModelSpec(), tokenizer="/tok")
    assert load_result(materialized("t/new-train", new), TrainResult) == new


# ---------------------------------------------------------------- refused at record time

class Tagged(pydantic.BaseModel):
    tags: Any


def nested(depth: int) -> list[Any]:
    xs: list[Any] = []
    for _ in range(depth):
        xs = [xs]
    return xs


def self_containing() -> list[Any]:
    xs: list[Any] = []
    xs.append(xs)
    return xs


REFUSED = {
    "int_key": (lambda: Loose([1], per_step={3: 0.5}),
                r"step 't/int_key': result\.per_step has a key 3 of type int; keys must be strings"),
    "int_key_in_plain_dict": (lambda: {"per_step": {1: 2.0}},
                              r"result\['per_step'\] has a key 1 of type int; keys must be strings"),
    "one_element_array": (lambda: {"w": np.array([5])},
                          r"result\['w'\] is an array of shape \(1,\) \(int64\); return \.tolist\(\)"),
    "array_with_a_shape": (lambda: Loose([1], anything=np.zeros((2, 3))),
                           r"result\.anything is an array of shape \(2, 3\) \(float64\); return \.tolist\(\)"),
    "deep_path": (lambda: Outer([Inner(1), Inner(2), Inner(np.arange(4))]),
                  r"step 't/deep_path': result\.xs\[2\]\.y is an array of shape \(4,\)"),
    "datetime_in_an_any_field": (lambda: Loose([1], when=WHEN),
                                 r"result\.when would load back as str, not datetime: annotate the field"),
    "datetime_in_a_plain_dict": (lambda: {"when": WHEN},
                                 r"result\['when'\] would load back as str, not datetime: a bare"),
    "tuple_in_a_list_field": (lambda: Loose((1, 2)), r"result\.items would load back as list, not tuple"),
    "dataclass_in_an_any_field": (lambda: Loose([1], anything=Point(1, 2.0)),
                                  r"result\.anything would load back as dict, not Point: annotate the field"),
    "enum_in_an_any_field": (lambda: Loose([1], anything=Color.RED),
                             r"result\.anything would load back as str, not Color"),
    "list_of_dataclasses": (lambda: [Point(1, 2.0)],
                            r"result\[0\] would load back as dict, not Point: a bare list"),
    "str_where_int_is_annotated": (lambda: Point("3", 1.0),
                                   r"step 't/str_where_int_is_annotated': result\.x: expected int, got str '3'"
                                   r" \(so it would not load back as Point\)"),
    "float_where_int_is_annotated": (lambda: Curve(1.0, [], 2.5), r"result\.steps: expected int, got float 2\.5"),
    "no_union_member_fits": (lambda: Loose([1], maybe="a"),
                             r"result\.maybe: str 'a' fits no member of int \| None"),
    "wrong_item_type": (lambda: Loose([1, "2"]), r"result\.items\[1\]: expected int, got str '2'"),
    "callable": (lambda: {"f": len}, r"result\['f'\] is a callable \(len\)"),
    "unknown_type": (lambda: Loose([1], anything=object()), r"result\.anything is of type object, which cannot"),
    "bytes": (lambda: {"b": b"x"}, r"result\['b'\] is of type bytes, which cannot be recorded"),
    "any_tuple_in_a_pydantic_model": (lambda: Tagged(tags=(1, 2)), r"result\.tags would load back as list, not tuple"),
    "deeply_nested": (lambda: nested(5000), r"result is nested too deeply to record"),
    "self_containing": (self_containing, r"result is nested too deeply to record"),
}


@pytest.mark.parametrize("case", REFUSED)
def test_a_result_that_would_not_load_back_equal_fails_the_step(prefix, case):
    make, message = REFUSED[case]
    value = make()
    step = Step(name=f"t/{case}", fn=lambda out: value)
    with pytest.raises(StepResultError, match=f"step 't/{case}': ") as caught:
        materialize_step(step, settings=FAST)
    assert caught.match(message)
    status = read_status(step.output_path)
    assert status.status is Status.FAILED and "StepResultError" in status.error
    assert not os.path.exists(record_of(step))


def test_step_result_error_is_a_type_error():
    assert issubclass(StepResultError, TypeError)


# ---------------------------------------------------------------- refused at load time

MISFITS = {
    "str_for_int": ({"x": "3", "y": 1.0}, Point, TypeError, r"result\.x: expected int, got str '3'"),
    "bool_for_int": ({"x": True, "y": 1.0}, Point, TypeError, r"result\.x: expected int, got bool True"),
    "unknown_field": ({"x": 1, "y": 1.0, "z": 0}, Point, ValueError,
                      r"result: the record has field\(s\) 'z' that Point does not have"),
    "missing_required_field": ({"x": 1}, Point, ValueError,
                               r"the record lacks Point's field 'y', which has no default"),
    "no_union_member": ([1], Point | None, TypeError, r"result: list \[1\] fits no member of .*Point \| None"),
    "null_for_int": (None, int, TypeError, r"result: expected int, got null None"),
    "bad_enum_value": ("green", Color, ValueError, r"result: str 'green' is not a value of Color"),
    "bad_datetime": ("yesterday", dt.datetime, ValueError, r"'yesterday' is not an ISO datetime"),
    "datetime_for_date": ("2024-01-01T00:00:00", dt.date, ValueError, r"is not an ISO date"),
    "tuple_length": ([1, "a", 3], tuple[int, str], ValueError, r"expected 2 items for tuple\[int, str\], got 3"),
    "nested_path": ({"xs": [{"y": 1}, {"z": 2}]}, Outer, ValueError, r"result\.xs\[1\]: the record has field\(s\) 'z'"),
    "dict_key_type": ({"purple": 1}, dict[Color, int], ValueError, r"result key 'purple': .* not a value of Color"),
    "pydantic_unknown_field": ({"name": "e", "extra": 1}, Eval, ValueError, r"that Eval does not have"),
    "pydantic_invalid": ({"name": "e", "when": "x", "shape": [1, 2], "color": "red", "loss": 1.0,
                          "point": {"x": 1, "y": 2.0}}, Eval, ValueError, r"result: Eval refused the recorded values"),
}


@pytest.mark.parametrize("case", MISFITS)
def test_json_that_does_not_fit_the_type_is_an_error(case):
    data, tp, error, message = MISFITS[case]
    with pytest.raises(error, match=message):
        from_jsonable(data, tp)


def test_load_result_with_a_type_the_record_does_not_fit_names_the_output(prefix):
    step = materialized("t/counted", {"x": "3", "y": 1.0})
    with pytest.raises(TypeError, match=r"does not load as Point: result\.x: expected int, got str '3'"):
        load_result(step, Point)
    assert load_result(step) == {"x": "3", "y": 1.0}  # untyped: the JSON as recorded


def test_loading_is_exact_where_json_is_ambiguous():
    assert from_jsonable(3, float) == 3 and from_jsonable([1, 2], tuple[int, ...]) == (1, 2)
    assert from_jsonable(["/a"], list[PurePosixPath]) == [PurePosixPath("/a")]
    assert from_jsonable({"red": 1}, dict[Color, int]) == {Color.RED: 1}
    assert from_jsonable([1, "a"], list[int | str]) == [1, "a"]
    assert from_jsonable(None, int | None) is None
