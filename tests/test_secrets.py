"""Secrets are used and never written down: a distinctive Hugging Face token and cloud credentials planted in
the environment of a real `dagster asset materialize` and used there — the token by a download from a private
(local) hub repository, the AWS keys by a step writing to a local S3 that checks signatures, the service account
key by the same step signing its way to a GCS token and writing to the GCS emulator — then searched for in every
record and status, every file of the Dagster instance (event log, run config, captured logs), the Ray session
files and the command's own output."""

import shutil
import subprocess
import tempfile
import textwrap
from pathlib import Path

import botocore.exceptions
import fsspec
import pytest

from tests.support.cloud_secrets import GCS_BUCKET, PROBE, S3_BUCKET, s3_client, service_account, signed_s3
from tests.support.helpers import BIN, ROOT, subprocess_env
from tests.support.hub_server import HubRepo, serve_hub

HF_TOKEN = "hf_plantedSecretZq7Xw3Lk9Vb2Nm4Rt6Yp8"
GCP_ACCESS_TOKEN = "ya29.plantedAccessTokenQ4w5E6r7T8"

DEFS = textwrap.dedent("""
    from marin_assets import Step, build_definitions
    from marin_assets.pipeline.data.download import hf_download_step
    from marin_assets.pipeline.hello import numbers_step
    from tests.support.cloud_secrets import use_cloud_credentials

    defs = build_definitions([hf_download_step("raw/private", "user/private", "main"),
                              numbers_step("hello/numbers", n=10),
                              Step(name="raw/cloud", fn=use_cloud_credentials, hash_attrs={"probe": 1})])
""")


def files_containing(root: Path, needle: bytes) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.is_file() and needle in p.read_bytes()]


def test_planted_secrets_are_used_by_steps_but_reach_no_record_metadata_or_log(tmp_path, gcs):
    repo = HubRepo("user/private", {"data/a.jsonl": '{"text": "private"}\n'}, private=True)
    (tmp_path / "defs.py").write_text(DEFS)
    fsspec.filesystem("gs").mkdir(GCS_BUCKET)
    home, prefix = tmp_path / "home", tmp_path / "outputs"
    ray_tmp = Path(tempfile.mkdtemp(prefix="mrs-", dir="/tmp"))  # short: Ray's socket paths have a length limit
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    with serve_hub(repo) as hub, signed_s3(tmp_path / "moto.log") as s3, \
            service_account(tmp_path / "gcp-key.json", GCP_ACCESS_TOKEN) as gcp:
        env = subprocess_env(DAGSTER_HOME=str(home), MARIN_PREFIX=str(prefix), HF_ENDPOINT=hub.url,
                             HF_HUB_OFFLINE="0", HF_TOKEN=HF_TOKEN, AWS_ACCESS_KEY_ID=s3.key_id,
                             AWS_SECRET_ACCESS_KEY=s3.secret, AWS_ENDPOINT_URL_S3=s3.url, TMPDIR=str(ray_tmp),
                             GOOGLE_APPLICATION_CREDENTIALS=str(tmp_path / "gcp-key.json"))
        force = '{"ops": {"raw__private": {"config": {"force": true}}}}'
        run = subprocess.run([str(BIN / "dagster"), "asset", "materialize", "-f", str(tmp_path / "defs.py"),
                              "--select", "*", "--config-json", force],
                             cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr[-3000:]
        used = [r for r in hub.requests if r.headers.get("authorization") == f"Bearer {HF_TOKEN}"]
        assert used, "the token was not sent to the hub"  # read from the environment and used
        # The AWS secret signed the step's requests: this S3 refuses a wrong one, and holds what the step wrote.
        assert s3_client(s3).get_object(Bucket=S3_BUCKET, Key="probe")["Body"].read() == PROBE
        with pytest.raises(botocore.exceptions.ClientError, match="SignatureDoesNotMatch"):
            s3_client(s3, secret="not" + s3.secret[3:]).get_object(Bucket=S3_BUCKET, Key="probe")
        # The service account's private key signed the step's token request, verified with its public key.
        assert [c["iss"] for c in gcp.verified] and all(c["iss"] == "planted@test.iam.gserviceaccount.com"
                                                        for c in gcp.verified)
        assert fsspec.filesystem("gs").cat(f"{GCS_BUCKET}/probe") == PROBE
        secrets = [HF_TOKEN, s3.secret, GCP_ACCESS_TOKEN, *pem_lines(gcp.pem)]

    assert (prefix / "raw").exists() and len(list(prefix.rglob(".artifact.json"))) == 3
    for secret in secrets:
        needle = secret.encode()
        assert needle not in (run.stdout + run.stderr).encode()
        assert files_containing(prefix, needle) == []  # records, statuses, data
        assert files_containing(home, needle) == []  # event log and run config (SQLite), captured logs
        assert files_containing(ray_tmp, needle) == []  # Ray session logs, if any were kept
    assert list(home.rglob("*.db")) and list(home.rglob("compute_logs/*.err")), "nothing stored: nothing searched"
    shutil.rmtree(ray_tmp, ignore_errors=True)


def pem_lines(pem: str) -> list[str]:
    """The private key's full base64 lines (a leak shows them whole, with or without its newlines escaped; the
    short last line could match by chance)."""
    lines = [line for line in pem.splitlines() if len(line) == 64]
    assert len(lines) > 10
    return lines
