"""Training logs to W&B (offline here) and TensorBoard beside its JSON metrics: a real `dagster asset
materialize` of a tiny training with both on and a planted `WANDB_API_KEY`; the W&B run's own history file
and the TensorBoard event files hold the JSON metrics' training losses, the record says where they are,
tracking is not identity, and the key is written nowhere."""

import json
import shutil
import struct
import subprocess
import tempfile
import textwrap
from pathlib import Path

import dagster as dg

from marin_assets.core.record import read_record
from marin_assets.dagster.instance import write_instance_yaml
from marin_assets.pipeline.data.corpus import corpus_step
from marin_assets.pipeline.training.levanter_trainer import read_metrics
from marin_assets.pipeline.training.runner import METRICS_FILE
from marin_assets.pipeline.training.specs import ModelSpec, OptimizerSpec, TrainerSpec
from marin_assets.pipeline.training.tracking import Tracking
from marin_assets.steps import language_model_pipeline
from tests.support.helpers import BIN, ROOT, subprocess_env
from tests.test_secrets import files_containing

WANDB_KEY = "wandbPlantedSecretKey0123456789abcdefABCDEF"  # 40+ characters, as W&B keys are
TINY = ModelSpec(hidden_dim=32, intermediate_dim=64, num_layers=1, num_heads=2, num_kv_heads=2, seq_len=64)
SHORT = TrainerSpec(num_train_steps=4, train_batch_size=4, checkpoint_every=5, steps_per_eval=5, max_eval_batches=1)
TRACKING = Tracking(wandb_project="marin-tests", wandb_entity="marin", wandb_tags=("tiny", "ci"), tensorboard=True)

DEFS = textwrap.dedent("""
    from marin_assets import build_definitions
    from tests.test_tracking import tracked_training

    defs = build_definitions([tracked_training()])
""")


def tracked_training(tracking: Tracking | None = TRACKING):
    """The tiny training (and the steps it reads), logging to W&B and TensorBoard."""
    stories = corpus_step("raw/tracked", train_documents=300, validation_documents=30, seed=3, shards=1)
    return language_model_pipeline("tracked", stories, dataset="stories", vocab_size=300, model=TINY,
                                   optimizer=OptimizerSpec(learning_rate=1e-2), trainer=SHORT, export=False,
                                   evaluate=False, tracking=tracking).train


def test_tracking_is_not_identity():
    plain = tracked_training(None)
    for tracking in (TRACKING, Tracking(wandb_project="other"), Tracking(tensorboard=True)):
        assert tracked_training(tracking).hash == plain.hash
        assert tracked_training(tracking).output_path == plain.output_path


def wandb_records(path: Path) -> list[bytes]:
    """The records of a `.wandb` file: W&B's LevelDB-style log (a 7-byte header, then 32 KiB blocks of
    chunks: CRC (4), length (2), type (1: whole, 2: first, 3: middle, 4: last), data)."""
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    records, partial, pos = [], b"", 7
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        length, kind = struct.unpack("<HB", data[pos + 4:pos + 7])
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind == 0 and length == 0:
            continue
        partial = chunk if kind in (1, 2) else partial + chunk
        if kind in (1, 4):
            records.append(partial)
    return records


def wandb_run(run_dir: Path) -> tuple[dict, dict[int, dict]]:
    """The W&B run's settings (project, entity, tags, id) and step → the metrics it logged, read back from
    its offline `.wandb` file."""
    from wandb.proto import wandb_internal_pb2

    [log] = run_dir.glob("*.wandb")
    run: dict = {}
    history: dict[int, dict] = {}
    for raw in wandb_records(log):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run = {"project": record.run.project, "entity": record.run.entity, "tags": list(record.run.tags),
                   "id": record.run.run_id}
        elif kind == "history":
            items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
            if "_step" in items:
                history.setdefault(int(items["_step"]), {}).update(items)
    return run, history


def tensorboard_scalars(logdir: str, tag: str) -> dict[int, float]:
    """step → value of a scalar in the TensorBoard event files under `logdir`."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = [p for p in Path(logdir).rglob("events.out.tfevents.*")]
    assert events, f"no TensorBoard event file under {logdir}"
    scalars: dict[int, float] = {}
    for folder in {p.parent for p in events}:
        accumulator = EventAccumulator(str(folder))
        accumulator.Reload()
        if tag in accumulator.Tags()["scalars"]:
            scalars.update({e.step: e.value for e in accumulator.Scalars(tag)})
    return scalars


def test_wandb_offline_and_tensorboard_hold_the_json_losses_and_the_key_is_written_nowhere(tmp_path):
    (tmp_path / "defs.py").write_text(DEFS)
    home, prefix = tmp_path / "home", tmp_path / "outputs"
    ray_tmp = Path(tempfile.mkdtemp(prefix="mrt-", dir="/tmp"))  # short: Ray's socket paths have a length limit
    home.mkdir()
    write_instance_yaml(home / "dagster.yaml")
    env = subprocess_env(DAGSTER_HOME=str(home), MARIN_PREFIX=str(prefix), TMPDIR=str(ray_tmp),
                         WANDB_MODE="offline", WANDB_API_KEY=WANDB_KEY, WANDB_SILENT="true")
    run = subprocess.run([str(BIN / "dagster"), "asset", "materialize", "-f", str(tmp_path / "defs.py"),
                          "--select", "*"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]

    step = tracked_training()
    out = prefix / f"{step.name}_{step.hash}"
    record = read_record(str(out))
    tracked = record.result["tracking"]
    assert tracked["wandb_url"] is None  # offline: no URL, the run's folder instead
    run_dir = Path(tracked["wandb_dir"])
    assert run_dir.is_dir() and list((out / "wandb").glob("*run-*")) == [run_dir]  # one run folder
    assert run_dir.name.startswith("offline-run-") and run_dir.name.endswith(step.name_with_hash.rsplit("/")[-1])
    assert tracked["tensorboard_dir"] == str(out / "tensorboard")

    metrics = read_metrics(str(out / METRICS_FILE))
    json_losses = {s: m["train/loss"] for s, m in metrics.items() if "train/loss" in m}
    assert sorted(json_losses) == list(range(SHORT.num_train_steps))
    assert [[s, v] for s, v in sorted(json_losses.items())] == record.result["loss_curve"]

    settings, history = wandb_run(run_dir)
    assert settings == {"project": "marin-tests", "entity": "marin", "tags": ["tiny", "ci"], "id": out.name}
    assert {s: h["train/loss"] for s, h in history.items() if "train/loss" in h} == json_losses
    boards = tensorboard_scalars(tracked["tensorboard_dir"], "train/loss")
    assert boards.keys() == json_losses.keys()
    assert all(abs(boards[s] - v) <= 1e-6 * max(1.0, abs(v)) for s, v in json_losses.items())  # float32 in events

    instance = dg.DagsterInstance.from_config(str(home))
    event = instance.get_latest_materialization_event(dg.AssetKey(["checkpoints", "tracked-llama"]))
    assert event is not None and event.asset_materialization is not None
    shown = {k: getattr(v, "value", v) for k, v in event.asset_materialization.metadata.items()}
    assert shown["result.tracking.wandb_dir"] == str(run_dir)  # the UI shows where the run's W&B files are
    assert shown["result.tracking.tensorboard_dir"] == tracked["tensorboard_dir"]

    needle = WANDB_KEY.encode()
    assert needle not in (run.stdout + run.stderr).encode()
    assert files_containing(prefix, needle) == []  # records, metrics, W&B offline files, TensorBoard events
    assert files_containing(home, needle) == []  # Dagster metadata (event log, SQLite), captured logs
    assert files_containing(ray_tmp, needle) == []  # Ray session logs, if any were kept
    assert list(home.rglob("*.db")) and list(home.rglob("compute_logs/*.err")), "nothing stored: nothing searched"
    shutil.rmtree(ray_tmp, ignore_errors=True)
