"""Fixtures only (never imported): shared helpers live in `tests/support/`."""

import os
import shutil
import tempfile

import pytest

# Tests never reach a hub or an accelerator, whoever runs them.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

# One JAX compilation cache for the session, shared by every process it starts (Ray workers, CLI
# subprocesses): dozens of tiny trainings of the same shapes compile once, not once per process. It is
# the persistent cache Levanter users turn on (`jax_compilation_cache_dir`); a fresh folder each session.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="marin-test-jax-cache-")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    JAX_CACHE_MADE_HERE: str | None = os.environ["JAX_COMPILATION_CACHE_DIR"]
else:
    JAX_CACHE_MADE_HERE = None

# XLA's CPU backend without LLVM's optimization passes, for this process and every process it starts (Ray
# forwards XLA_FLAGS to its workers): the tests' models are tiny, so compiling a training step takes far longer
# than running it, and at level 0 it compiles in about half the CPU time (a tiny training: ~6 CPU s instead of
# ~12). Every process of a session compiles alike, so runs compared to the bit stay comparable; the flags are
# part of the compilation cache's key. Set XLA_FLAGS with another level to test optimized code.
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_backend_optimization_level=0".strip()


def pytest_unconfigure(config):
    """The compilation cache goes with the process that made it: under `make test`'s workers (pytest-xdist) that
    is the controller, which runs no test but made the folder before starting the workers that share it."""
    if JAX_CACHE_MADE_HERE:
        shutil.rmtree(JAX_CACHE_MADE_HERE, ignore_errors=True)


# `make test` runs two workers (pytest-xdist, `--dist loadfile`: a file's tests, and so its module fixtures, stay
# on one worker). A worker takes the next file in collection order when it runs dry, so the files that take
# longest go first (longest-first scheduling): both workers then finish close together instead of one running
# a long file alone at the end. Seconds measured on 2 cores (a file's setup, calls and teardown); the rest keep
# their order after these.
LONGEST_FILES = (  # measured on 3fd87ab, a whole `make test` on 2 cores (JUnit times per file, rounded)
    "test_multihost.py",            # 960 s: two-host training, DPO, RL and evaluation on a two-node Ray cluster
    "test_restart_soak.py",         # 570 s: three trainings, the daemon or code server killed and restarted
    "test_ui_browser.py",           # 450 s: dagster dev, the demo graph, a real browser
    "test_ray_two_nodes.py",        # 270 s: a second Ray node killed mid-step
    "test_generative_eval.py",      # 250 s: two models trained, scored on word problems
    "test_checkpoint_sensor.py",    # 230 s: the daemon evaluating checkpoints across a restart
    "test_scaling_laws.py",         # 230 s: a real ladder of trainings
    "test_rl.py",                   # 180 s
    "test_crash_trials.py",         # 180 s: kill -9 at random moments
    "test_dg_cli.py",               # 175 s
    "test_generation.py",           # 170 s
    "test_llm_pipeline.py",         # 155 s
    "test_train_sources.py",        # 130 s
    "test_local_ray.py",            # 110 s
    "test_racing_runs.py",          # 100 s
    "test_serve.py",                # 100 s
    "test_ray_cluster.py",          # 100 s
    "test_quiet_output.py",         # 95 s
    "test_tokenize_real.py",        # 90 s
    "test_training_methods.py",     # 90 s
    "test_plan_cli.py",             # 85 s
    "test_generate_step.py",        # 80 s
    "test_preemption.py",           # 70 s
    "test_gcs_storage.py",          # 70 s
    "test_priced_plan.py",          # 65 s
    "test_tokenize_pipeline.py",    # 65 s
    "test_lost_lease.py",           # 65 s
    "test_dagster_adapter.py",      # 65 s
    "test_tracking.py",             # 65 s
    "test_dpo.py",                  # 60 s
    "test_experiment_summary.py",   # 60 s
    "test_experiment_component.py",  # 55 s
    "test_perplexity_gap.py",
    "test_curation_chain.py",
    "test_secrets.py",
    "test_harness_eval.py",
    "test_fuzzy_same_document.py",  # 30 s: real templated text gathered, fuzzy dedup twice
)


def pytest_collection_modifyitems(config, items):
    rank = {name: position for position, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: every other order kept



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
    from marin_assets.dagster.instance import write_instance_yaml

    write_instance_yaml(home / "dagster.yaml")  # the project's instance settings (marin_assets/dagster/instance.py)
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    return home


@pytest.fixture(scope="session")
def local_ray():
    """One embedded Ray for the in-process tests (resources reuse an initialized Ray)."""
    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, object_store_memory=256 * 2**20)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def gcs(tmp_path_factory):
    """A GCS emulator for the whole session, with this process's GCS clients pointed at it
    (through the environment, which subprocesses inherit) and a bucket `marin`."""
    import fsspec

    from tests.support.gcs_emulator import gcs_emulator, use_emulator

    with gcs_emulator(tmp_path_factory.mktemp("gcs") / "emulator.log") as url:
        use_emulator(url)
        fsspec.filesystem("gs").mkdir("marin")
        yield url


@pytest.fixture
def gs_prefix(gcs):
    """A fresh `gs://marin/<random>` storage prefix on the emulator."""
    import uuid

    return f"gs://marin/{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="session")
def s3(tmp_path_factory):
    """A local S3 (moto's server) for the whole session, with this process's S3 clients pointed at it
    (through the standard AWS variables, which subprocesses inherit) and a bucket `marin`."""
    import fsspec

    from tests.support.s3_server import moto_s3_server, use_s3_server

    with moto_s3_server(tmp_path_factory.mktemp("s3") / "moto.log") as url:
        use_s3_server(url)
        fsspec.filesystem("s3").mkdir("marin")
        yield url


@pytest.fixture
def s3_prefix(s3):
    """A fresh `s3://marin/<random>` storage prefix on the local S3."""
    import uuid

    return f"s3://marin/{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="session")
def planted(tmp_path_factory):
    """The planted corpus (real documentation with known defects, `curation.planted`): raw, normalized
    into several shards, and its truth. Stages read `planted.normalized` and write under their own tmp_path.
    `planted.step` adopts the raw folder as a materialized step (SUCCESS), to use as a dependency."""
    from types import SimpleNamespace

    from marin_assets import Step, materialize_step
    from marin_assets.pipeline.curation.normalize import normalize
    from marin_assets.pipeline.curation.planted import plant_corpus

    root = tmp_path_factory.mktemp("planted")
    truth = plant_corpus(str(root / "raw"))
    normalized = normalize(str(root / "normalized"), str(root / "raw"), target_shard_bytes=100_000)
    step = Step(name="raw/planted", fn=lambda out: None, override_output_path=str(root / "raw"))
    materialize_step(step, prefix=str(root / "prefix"))
    return SimpleNamespace(raw=str(root / "raw"), normalized=str(root / "normalized"), truth=truth,
                           normalize_result=normalized, step=step)
