"""Records named their result's type by module (now by a declared storage name: tests/test_record_names.py);
records written before the library moved into wings name modules that no longer exist, and must still load as
the same types."""

import json
import os

import pytest

from marin_assets import Step, materialize_step
from marin_assets.core.record import RECORD_FILE, load_result, resolve_type
from marin_assets.pipeline import MOVED_TYPES
from marin_assets.pipeline.training.training_run import TrainResult


@pytest.mark.parametrize("old", sorted(MOVED_TYPES))
def test_every_moved_type_resolves_from_its_old_name_to_the_same_class(old):
    new = MOVED_TYPES[old]
    assert resolve_type(old) is resolve_type(new)
    assert resolve_type(old).__qualname__ == old.partition(":")[2]


def test_a_record_written_before_the_move_loads_as_its_type(tmp_path):
    result = TrainResult(run_id="r", steps=2, final_train_loss=1.0, final_eval_loss=None, eval_losses={},
                         tokens_per_second=None, checkpoint_steps=[1], checkpoint_dir="/c", hf_dir=None)
    step = Step(name="checkpoints/old-layout", fn=lambda out: result, hash_attrs={"v": 1})
    out = materialize_step(step, prefix=str(tmp_path)).output_path
    record = os.path.join(out, RECORD_FILE)
    raw = json.loads(open(record).read())
    assert raw["result_type"] == "train_result"  # its storage name (core/record_types.py)
    raw["result_type"] = "marin_assets.pipeline.train:TrainResult"  # as the previous layout wrote it
    with open(record, "w") as f:
        json.dump(raw, f)
    assert load_result(out) == result
    with pytest.raises(ModuleNotFoundError):
        resolve_type("marin_assets.pipeline.never_was:Thing")
