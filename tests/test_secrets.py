"""Secrets are used and never written down: a distinctive Hugging Face token and cloud
credentials planted in the environment of a real `dagster asset materialize`, then searched
for in every record and status, every file of the Dagster instance (event log, run config,
captured logs), the Ray session files and the command's own output."""

import shutil
import subprocess
import tempfile
import textwrap
from pathlib import Path

from tests.support.helpers import BIN, ROOT, subprocess_env
from tests.support.hub_server import HubRepo, serve_hub

HF_TOKEN = "hf_plantedSecretZq7Xw3Lk9Vb2Nm4Rt6Yp8"
AWS_SECRET = "awsPlantedSecretKey/Qz9x8C7v6B5n4M3"
GCP_KEY = "-----BEGIN PRIVATE KEY-----plantedGcpKeyW2e3R4t5Y6-----END PRIVATE KEY-----"
SECRETS = [HF_TOKEN, AWS_SECRET, GCP_KEY]

DEFS = textwrap.dedent("""
    from marin_assets import build_definitions
    from marin_assets.pipeline.data.download import hf_download_step
    from marin_assets.pipeline.hello import numbers_step

    defs = build_definitions([hf_download_step("raw/private", "user/private", "main"),
                              numbers_step("hello/numbers", n=10)])
""")


def files_containing(root: Path, needle: bytes) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.is_file() and needle in p.read_bytes()]


def test_planted_secrets_reach_the_hub_but_no_record_metadata_or_log(tmp_path):
    repo = HubRepo("user/private", {"data/a.jsonl": '{"text": "private"}\n'}, private=True)
    (tmp_path / "defs.py").write_text(DEFS)
    (tmp_path / "gcp-key.json").write_text('{"type": "service_account", "private_key": "' + GCP_KEY + '"}')
    home, prefix = tmp_path / "home", tmp_path / "outputs"
    ray_tmp = Path(tempfile.mkdtemp(prefix="mrs-", dir="/tmp"))  # short: Ray's socket paths have a length limit
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    with serve_hub(repo) as hub:
        env = subprocess_env(DAGSTER_HOME=str(home), MARIN_PREFIX=str(prefix), HF_ENDPOINT=hub.url,
                             HF_HUB_OFFLINE="0", HF_TOKEN=HF_TOKEN, AWS_ACCESS_KEY_ID="AKIAPLANTED",
                             AWS_SECRET_ACCESS_KEY=AWS_SECRET, TMPDIR=str(ray_tmp),
                             GOOGLE_APPLICATION_CREDENTIALS=str(tmp_path / "gcp-key.json"))
        force = '{"ops": {"raw__private": {"config": {"force": true}}}}'
        run = subprocess.run([str(BIN / "dagster"), "asset", "materialize", "-f", str(tmp_path / "defs.py"),
                              "--select", "*", "--config-json", force],
                             cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr[-3000:]
        used = [r for r in hub.requests if r.headers.get("authorization") == f"Bearer {HF_TOKEN}"]
        assert used, "the token was not sent to the hub"  # read from the environment and used

    assert (prefix / "raw").exists() and list(prefix.rglob(".artifact.json"))
    for secret in SECRETS:
        needle = secret.encode()
        assert needle not in (run.stdout + run.stderr).encode()
        assert files_containing(prefix, needle) == []  # records, statuses, data
        assert files_containing(home, needle) == []  # event log and run config (SQLite), captured logs
        assert files_containing(ray_tmp, needle) == []  # Ray session logs, if any were kept
    assert list(home.rglob("*.db")) and list(home.rglob("compute_logs/*.err")), "nothing stored: nothing searched"
    shutil.rmtree(ray_tmp, ignore_errors=True)
