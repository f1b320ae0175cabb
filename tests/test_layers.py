"""The layers hold: the protocol and the pipeline library work where Dagster and Ray cannot be
imported, a Ray worker running a step never imports Dagster, and the demo's identities are
pinned: a refactor that moves one fails here, and a deliberate change updates them here."""

import json
import subprocess
import sys
import textwrap

from tests.support.helpers import ROOT, subprocess_env

BLOCKER = textwrap.dedent('''
    import importlib.abc, os, sys

    class _Blocked(importlib.abc.MetaPathFinder):
        """Makes the named top-level packages unimportable, as if not installed."""
        names = set(os.environ["BLOCKED_IMPORTS"].split(","))

        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in self.names:
                raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)")
            return None

    sys.meta_path.insert(0, _Blocked())
''')

PINNED_PYTHON = ("CPython", "3.11.7")
"""The demo's corpus is its Python's documentation, so its identities are pinned for one build."""
DEMO_IDENTITIES = {
    # hello world: unchanged since main before the reshape (commit a64be54).
    "hello/numbers": "82a38aee", "hello/stats": "f5f941d3", "hello/report": "be4dfeca",
    # The demo on CPython 3.11.7's documentation (python_docs.build(python=PythonBuild(*PINNED_PYTHON))).
    "raw/python-docs": "27a0044c", "tokenizers/python-docs-bpe": "b157f5ad",
    "tokenized/python-docs-bpe": "2f5acf1a", "checkpoints/python-docs-llama": "f3fbbaa1",
    "exports/python-docs-llama": "e9c9e65c", "evals/python-docs-llama": "1531a041",
}
CHECKPOINT_EVALS_IDENTITY = ("5f3b0b30", "e5635806")  # the asset's code version; its partition 50's step
STORIES_IDENTITIES = {
    # The generated-stories pipeline the tests build (tiny_stories.build()), the demo until it moved to
    # real text: its corpus as on a64be54; the tokenizer's text_field, the tokenize step's framing and
    # backend, and ModelSpec's new fields (vocab_multiple, norms, rope, tying) moved the rest.
    "raw/tiny-stories": "4495d5b3", "tokenizers/tiny-stories-bpe": "d6dc4887",
    "tokenized/tiny-stories-bpe": "1b32683f", "checkpoints/tiny-stories-llama": "15b5c700",
    "exports/tiny-stories-llama": "f0f1bdc6", "evals/tiny-stories-llama": "a4bb1a18",
}


def run_blocked(script: str, blocked: str, tmp_path) -> dict:
    """Run `script` in a fresh interpreter where `blocked` packages cannot be imported; its last line is JSON."""
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(BLOCKER)  # every Python process started with this PYTHONPATH
    env = subprocess_env(BLOCKED_IMPORTS=blocked, MARIN_PREFIX=str(tmp_path / "outputs"),
                         PINNED_PYTHON=json.dumps(PINNED_PYTHON))
    env["PYTHONPATH"] = f"{site}:{env['PYTHONPATH']}"
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_protocol_and_library_build_hash_plan_and_run_without_dagster_or_ray(tmp_path):
    found = run_blocked('''
        import importlib, json, os, pkgutil, sys
        try:
            import dagster  # noqa: F401
            raise SystemExit("dagster is importable: the blocker does not work")
        except ModuleNotFoundError:
            pass
        import marin_assets, marin_assets.core, marin_assets.pipeline, marin_assets.experiments
        modules = []
        for package in (marin_assets.core, marin_assets.pipeline, marin_assets.experiments):
            for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
                importlib.import_module(info.name)
                modules.append(info.name)
        from marin_assets import Step, load_result, materialize_step
        from marin_assets.core.plan import plan
        from marin_assets.core.step import walk
        from marin_assets.experiments import hello_world, python_docs, tiny_stories
        from marin_assets.pipeline.data.python_docs import PythonBuild
        steps = walk(hello_world.steps + python_docs.steps)
        prefix = os.environ["MARIN_PREFIX"]
        before = {r.asset_key: r.action for r in plan(steps, {s.name for s in steps}, prefix)}
        for step in walk(hello_world.steps):
            materialize_step(step, prefix=prefix)
        after = {r.asset_key: r.action for r in plan(steps, {s.name for s in steps}, prefix)}
        pinned = python_docs.build(python=PythonBuild(*json.loads(os.environ["PINNED_PYTHON"])))
        evals = python_docs.checkpoint_evals(pinned)
        stories = tiny_stories.build()
        print(json.dumps({"modules": modules,
                          "hashes": {s.name: s.hash for s in walk(hello_world.steps + [pinned["export"],
                                                                                       pinned["evaluate"]])},
                          "stories": {s.name: s.hash for s in walk([stories["export"], stories["evaluate"]])},
                          "demo_python": python_docs.pipeline["corpus"].hash_attrs["python"] == PythonBuild.current(),
                          "evals": [evals.hash, evals.step(50).hash], "before": before, "after": after,
                          "report": str(load_result(hello_world.report)),
                          "heavy": sorted(m for m in ("dagster", "ray", "levanter", "jax") if m in sys.modules)}))
    ''', "dagster,ray,dagster_gcp,dagster_postgres,dagster_webserver", tmp_path)
    assert "marin_assets.core.step" in found["modules"]
    assert "marin_assets.pipeline.training.pretrain.step" in found["modules"]
    assert found["heavy"] == []
    assert found["hashes"] == DEMO_IDENTITIES and found["stories"] == STORIES_IDENTITIES
    assert found["demo_python"]  # the demo itself is defined for the running Python's documentation
    assert tuple(found["evals"]) == CHECKPOINT_EVALS_IDENTITY
    assert set(found["before"].values()) <= {"run", "blocked"} and found["before"]["hello/numbers"] == "run"
    assert [found["after"][n] for n in ("hello/numbers", "hello/stats", "hello/report")] == ["reuse"] * 3
    assert "Hello, marin-assets" in found["report"]


def test_a_ray_worker_running_steps_never_imports_dagster(tmp_path):
    """Dagster is unimportable in this driver and in every Ray worker it starts: the steps still run."""
    found = run_blocked('''
        import json, logging, os, sys
        import ray
        from marin_assets import load_result, materialize_step
        from marin_assets.core.step import walk
        from marin_assets.execution.ray_runner import ray_runner
        from marin_assets.experiments import hello_world

        class LocalRay:
            fail_fast = True

            def connect(self):
                if not ray.is_initialized():
                    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False,
                             object_store_memory=128 * 2**20)

            def worker_env(self):
                return {}

        run = ray_runner(LocalRay(), logging.getLogger("test"))
        outcomes = [materialize_step(s, run_fn=run) for s in walk(hello_world.steps)]
        ray.shutdown()
        print(json.dumps({"computed": [not o.cached for o in outcomes], "driver_pid": os.getpid(),
                          "report": str(load_result(hello_world.report)),
                          "dagster_in_driver": "dagster" in sys.modules}))
    ''', "dagster,dagster_gcp,dagster_postgres,dagster_webserver", tmp_path)
    assert found["computed"] == [True, True, True]
    assert "Hello, marin-assets" in found["report"] and found["dagster_in_driver"] is False
