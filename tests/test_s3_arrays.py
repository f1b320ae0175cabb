"""boto3's S3 settings reach Levanter's tensorstore spec builder (`pipeline/tokens/array_store.py`): every way a
user points boto3 at a store — `AWS_ENDPOINT_URL_S3`, `AWS_ENDPOINT_URL`, a profile's `endpoint_url` or
`services` section, a shared credentials file — gives Levanter's own `build_kvstore_spec` the same store."""

from __future__ import annotations

import os

import pytest

from marin_assets.pipeline.tokens.array_store import (
    S3EndpointError,
    UnsupportedArrayStoreError,
    refuse_unsupported_array_store,
    s3_arrays,
    s3_settings,
)

AWS_VARIABLES = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                 "AWS_SESSION_TOKEN", "AWS_DEFAULT_REGION", "AWS_REGION", "AWS_PROFILE", "AWS_CONFIG_FILE",
                 "AWS_SHARED_CREDENTIALS_FILE")


@pytest.fixture
def aws_home(tmp_path, monkeypatch):
    """No AWS variable set, and boto3's config and credentials files in an empty folder."""
    for name in AWS_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".aws").mkdir()
    return tmp_path / ".aws"


def levanter_spec(path: str) -> dict:
    from levanter.tensorstore_serialization import build_kvstore_spec

    return build_kvstore_spec(path)


CASES = {
    # what the user set → the endpoint Levanter's spec must use for bucket `b`
    "AWS_ENDPOINT_URL_S3": ({"AWS_ENDPOINT_URL_S3": "https://store.example:9000"}, "", "https://b.store.example:9000"),
    "AWS_ENDPOINT_URL": ({"AWS_ENDPOINT_URL": "https://store.example"}, "", "https://b.store.example"),
    "S3 beats global": ({"AWS_ENDPOINT_URL": "https://other.example", "AWS_ENDPOINT_URL_S3": "https://s3.example"},
                        "", "https://b.s3.example"),
    "profile endpoint_url": ({"AWS_PROFILE": "lab"}, "[profile lab]\nendpoint_url = https://lab.example\n",
                             "https://b.lab.example"),
    "profile services": ({"AWS_PROFILE": "lab"},
                         "[profile lab]\nservices = lab-s3\n[services lab-s3]\ns3 =\n  endpoint_url = https://svc.example\n",
                         "https://b.svc.example"),
    "loopback address": ({"AWS_ENDPOINT_URL_S3": "http://127.0.0.1:5123"}, "", "http://b.localhost:5123"),
}


@pytest.mark.parametrize("variables,config,expected", CASES.values(), ids=CASES.keys())
def test_the_endpoint_boto3_resolves_reaches_levanters_spec(aws_home, monkeypatch, variables, config, expected):
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    (aws_home / "config").write_text(config)
    without = levanter_spec("s3://b/cache/x")
    if set(variables) != {"AWS_ENDPOINT_URL"}:  # the one setting Levanter reads itself
        assert without.get("endpoint") != expected  # Levanter alone would send the arrays elsewhere
    with s3_arrays(["/local/tokenizer", "s3://b/cache/x"]):
        assert levanter_spec("s3://b/cache/x")["endpoint"] == expected
    assert levanter_spec("s3://b/cache/x") == without  # the environment is restored


def test_nothing_changes_for_paths_off_s3_or_when_boto3_uses_aws(aws_home, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "https://store.example")
    before = dict(os.environ)
    with s3_arrays(["gs://b/x", "/local/y"]) as settings:
        assert settings == {} and dict(os.environ) == before
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    assert s3_settings() == {}  # AWS itself: Levanter's spec (bucket, region) is already right
    assert levanter_spec("s3://b/x") == {"driver": "s3", "path": "x", "bucket": "b", "aws_region": "eu-west-1"}


def test_a_profiles_region_and_credentials_file_reach_the_spec_but_no_key_is_copied(aws_home, monkeypatch):
    (aws_home / "config").write_text("[profile lab]\nregion = eu-central-1\n")
    (aws_home / "credentials").write_text("[lab]\naws_access_key_id = AKIDLAB\naws_secret_access_key = s3cr3t\n")
    monkeypatch.setenv("AWS_PROFILE", "lab")
    with s3_arrays(["s3://b/x"]) as settings:
        spec = levanter_spec("s3://b/x")
        assert spec["aws_region"] == "eu-central-1"
        assert spec["aws_credentials"] == {"type": "profile", "profile": "lab",
                                           "credentials_file": str(aws_home / "credentials"),
                                           "config_file": os.devnull}
        assert "AWS_ACCESS_KEY_ID" not in os.environ and "s3cr3t" not in repr(settings)
    assert "AWS_SHARED_CREDENTIALS_FILE" not in os.environ


def test_an_endpoint_at_a_non_loopback_address_is_refused_with_the_reason(aws_home, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://10.1.2.3:9000")
    with pytest.raises(S3EndpointError, match=r"10\.1\.2\.3:9000 is an IP address: tensorstore addresses buckets"
                                              r" by virtual host \(http://<bucket>\.10\.1\.2\.3\)"):
        s3_settings()


def test_schemes_levanter_cannot_write_arrays_to_are_refused_before_any_work():
    for fine in ("gs://bucket/tokenized/x_1", "s3://bucket/tokenized/x_1", "/data/tokenized/x_1", "outputs/x",
                 "file:///data/x"):
        refuse_unsupported_array_store(fine, "tokenized/x")
    with pytest.raises(UnsupportedArrayStoreError) as caught:
        refuse_unsupported_array_store("hf://datasets/me/x", "tokenized/x")
    assert str(caught.value) == (
        "tokenized/x: refusing to write Levanter arrays to hf://datasets/me/x: tensorstore (through Levanter)"
        " writes arrays to local folders, gs:// and s3:// only, not hf://; use one of those for this step's prefix")
