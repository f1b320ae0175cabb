"""Steps: identity → path, names, overrides, duplicates."""

import pytest

from marin_assets.core.paths import using_prefix
from marin_assets.core.step import Resources, Step, StepDefinitionError, walk


def noop(output_path):
    return None


def make(name="raw/data", deps=(), **attrs):
    return Step(name=name, fn=noop, deps=deps, hash_attrs=attrs)


def test_identical_attrs_give_the_same_path(prefix):
    a, b = make(n=1, tokenizer="gpt2"), make(tokenizer="gpt2", n=1)
    assert a.hash == b.hash
    assert a.output_path == b.output_path == f"{prefix}/raw/data_{a.hash}"


def test_any_attr_change_gives_a_new_path(prefix):
    base = make(n=1, opts={"lr": 0.1})
    for other in (make(n=2, opts={"lr": 0.1}), make(n=1, opts={"lr": 0.2}), make(n=1, opts={"lr": 0.1}, x=None)):
        assert other.hash != base.hash and other.output_path != base.output_path


def test_a_dependency_change_gives_new_paths_downstream(prefix):
    raw1, raw2 = make(n=1), make(n=2)
    tok1, tok2 = make("tokenized/data", deps=[raw1]), make("tokenized/data", deps=[raw2])
    train1, train2 = make("checkpoints/m", deps=[tok1]), make("checkpoints/m", deps=[tok2])
    assert tok1.hash != tok2.hash
    assert train1.output_path != train2.output_path


def test_the_prefix_does_not_change_the_hash(prefix):
    step = make("tokenized/data", deps=[make(n=1)], vocab=4096)
    with using_prefix("gs://bucket/region-a"):
        gcs_path, gcs_hash = step.output_path, step.hash
    assert gcs_path == f"gs://bucket/region-a/tokenized/data_{gcs_hash}"
    assert step.output_path == f"{prefix}/tokenized/data_{step.hash}"
    assert Step(name="tokenized/data", fn=noop, deps=[make(n=1)], hash_attrs={"vocab": 4096}).hash == gcs_hash


def test_override_output_path_bypasses_the_hash(prefix):
    rel = Step(name="raw/adopted", fn=noop, override_output_path="raw/existing-data")
    assert rel.output_path == f"{prefix}/raw/existing-data"
    absolute = Step(name="raw/adopted", fn=noop, override_output_path="/mnt/data/x/")
    assert absolute.output_path == "/mnt/data/x"
    url = Step(name="raw/adopted", fn=noop, override_output_path="gs://bucket/data")
    assert url.output_path == "gs://bucket/data"


BAD_NAMES = ["../escape", "a/../b", "/abs/path", "a//b", "a/", "", "a b", "-lead", ".hidden", "a/b!"]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_bad_names_fail_at_definition_time(name):
    with pytest.raises(StepDefinitionError, match="invalid step name|non-empty"):
        make(name)


def test_unencodable_attrs_fail_at_definition_time_naming_step_and_attr():
    with pytest.raises(StepDefinitionError) as e:
        Step(name="train/x", fn=noop, hash_attrs={"schedule": lambda s: s})
    assert "'train/x'" in str(e.value) and "hash_attrs['schedule'] is a callable" in str(e.value)


def test_two_different_steps_with_one_name_are_an_error():
    with pytest.raises(StepDefinitionError, match="two different steps are named 'raw/data'"):
        walk([make("a/x", deps=[make(n=1)]), make("a/y", deps=[make(n=2)])])


def test_the_same_step_reached_twice_is_one_step():
    raw = make(n=1)
    again = make(n=1)  # an equal step built by another factory call
    order = walk([make("a/x", deps=[raw]), make("a/y", deps=[again])])
    assert [s.name for s in order] == ["raw/data", "a/x", "a/y"]


def test_resources_are_validated_and_not_part_of_identity():
    with pytest.raises(StepDefinitionError):
        Resources(tpu_count=4)
    a = Step(name="t/x", fn=noop, resources=Resources(cpu=8, tpu_type="v4-8", tpu_count=4))
    assert a.hash == Step(name="t/x", fn=noop).hash
