import os
import sys
from pathlib import Path

import pytest

from marin_assets.core.lease import LeaseSettings

# Tests never reach a hub or an accelerator, whoever runs them.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
FAST = LeaseSettings(heartbeat_interval=0.2, stale_timeout=1.5, poll_interval=0.05)


@pytest.fixture
def prefix(tmp_path, monkeypatch):
    """A fresh storage prefix, also exported as MARIN_PREFIX."""
    p = tmp_path / "outputs"
    monkeypatch.setenv("MARIN_PREFIX", str(p))
    return str(p)


@pytest.fixture
def dagster_home(tmp_path, monkeypatch):
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    return home


def subprocess_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(extra)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


@pytest.fixture(scope="session")
def local_ray():
    """One embedded Ray for the in-process tests (resources reuse an initialized Ray)."""
    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, object_store_memory=256 * 2**20)
    yield ray
    ray.shutdown()


def record_call(events_file: str, fn, output_path: str):
    """Append the worker's pid to `events_file`, then run `fn`: counts calls across processes."""
    with open(events_file, "a") as f:
        f.write(f"{os.getpid()}\n")
    return fn(output_path)


def calls(events_file) -> list[int]:
    return [int(x) for x in Path(events_file).read_text().split()] if Path(events_file).exists() else []


def corpus_and_tokenizer(root: Path, train_documents: int, validation_documents: int, seed: int, shards: int,
                         vocab_size: int = 400) -> tuple[str, str]:
    """A generated corpus under `root/raw` and a BPE tokenizer trained on it under `root/tok`."""
    from marin_assets.pipeline.corpus import generate_corpus
    from marin_assets.pipeline.tokenizer import train_tokenizer

    raw = str(root / "raw")
    generate_corpus(raw, train_documents=train_documents, validation_documents=validation_documents, seed=seed,
                    shards=shards)
    return raw, train_tokenizer(str(root / "tok"), raw, vocab_size=vocab_size).path


@pytest.fixture(scope="session")
def gcs(tmp_path_factory):
    """A GCS emulator for the whole session, with this process's GCS clients pointed at it
    (through the environment, which subprocesses inherit) and a bucket `marin`."""
    import fsspec

    from tests.gcs_emulator import gcs_emulator, use_emulator

    with gcs_emulator(tmp_path_factory.mktemp("gcs") / "emulator.log") as url:
        use_emulator(url)
        fsspec.filesystem("gs").mkdir("marin")
        yield url


@pytest.fixture
def gs_prefix(gcs):
    """A fresh `gs://marin/<random>` storage prefix on the emulator."""
    import uuid

    return f"gs://marin/{uuid.uuid4().hex[:8]}"
