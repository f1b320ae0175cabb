"""Where Levanter's arrays can go, and the S3 settings that must reach tensorstore to get them there.

Levanter writes caches and checkpoints through tensorstore, whose S3 driver reads neither boto3's
configuration nor `AWS_ENDPOINT_URL_S3`: Levanter's spec builder (`build_kvstore_spec`) passes it only
`AWS_ENDPOINT_URL`, the region variables and, for credentials, the key variables or an explicit
`AWS_SHARED_CREDENTIALS_FILE`. A user who pointed boto3 (and with it s3fs, our ledgers, statuses and
records) at an S3-compatible store with `AWS_ENDPOINT_URL_S3` or a profile would get ledgers in that
store and arrays sent to AWS. `s3_arrays(paths)` resolves the S3 settings exactly as boto3 does and
hands them to Levanter for as long as a step touches `s3://` arrays.

tensorstore addresses a bucket on a custom endpoint by virtual host (`http://<bucket>.<host>`, as
Levanter chooses for CoreWeave): a name under `localhost` reaches the loopback (curl resolves every
`*.localhost` there), an IP address cannot carry a bucket, so a loopback address is named `localhost`
and any other address is refused with the reason.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
from collections.abc import Iterable, Iterator
from urllib.parse import urlsplit, urlunsplit

ARRAY_SCHEMES = ("", "file", "gs", "s3")
"""URL schemes Levanter's tensorstore spec builder writes arrays to (local folders, GCS, S3)."""


class UnsupportedArrayStoreError(ValueError):
    """Levanter arrays cannot be written where a step's output is (see `refuse_unsupported_array_store`)."""


def scheme_of(path: str) -> str:
    """A path's URL scheme, lower case; "" for a local path."""
    return path.split("://", 1)[0].lower() if "://" in path else ""


def refuse_unsupported_array_store(output_path: str, step_name: str) -> None:
    """Refuse, before anything is computed or written, an output where Levanter arrays cannot land.

    Every step that writes Levanter arrays (tokenize, chat tokenize, pretokenized caches, training's
    checkpoints) calls this first with its output path and its name: Levanter's spec builder knows local
    folders, `gs://` and `s3://` only, and would fail on any other scheme only after the work was done.
    """
    scheme = scheme_of(output_path)
    if scheme not in ARRAY_SCHEMES:
        raise UnsupportedArrayStoreError(
            f"{step_name}: refusing to write Levanter arrays to {output_path}: tensorstore (through Levanter)"
            f" writes arrays to local folders, gs:// and s3:// only, not {scheme}://; use one of those for this"
            " step's prefix")


class S3EndpointError(ValueError):
    """The S3 endpoint boto3 is configured with cannot be given to tensorstore."""


def _tensorstore_endpoint(endpoint: str) -> str:
    """`endpoint` as tensorstore can address buckets under it (by virtual host): a loopback address becomes
    `localhost`; another IP address is refused."""
    parts = urlsplit(endpoint)
    host = parts.hostname or ""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return endpoint.rstrip("/")
    if not address.is_loopback:
        raise S3EndpointError(
            f"the S3 endpoint {endpoint} is an IP address: tensorstore addresses buckets by virtual host"
            f" (http://<bucket>.{host}), which an address cannot carry; give the endpoint a DNS name")
    netloc = "localhost" + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, "", "")).rstrip("/")


def s3_settings() -> dict[str, str]:
    """The environment Levanter's tensorstore spec builder needs to reach S3 as boto3 would: the endpoint
    boto3 resolves (`AWS_ENDPOINT_URL_S3`, `AWS_ENDPOINT_URL`, a profile's `endpoint_url` or `services`
    section), its region, and a profile's shared credentials file. Only variables not already set; the
    keys themselves are never copied (tensorstore reads them from where boto3 found them)."""
    import boto3
    import botocore.session
    from botocore.config import Config

    environ = os.environ
    core = botocore.session.Session()
    session = boto3.session.Session(botocore_session=core)
    configured = session.client("s3").meta.endpoint_url
    default = session.client("s3", config=Config(ignore_configured_endpoint_urls=True)).meta.endpoint_url
    settings: dict[str, str] = {}
    if configured != default:
        endpoint = _tensorstore_endpoint(configured)
        if environ.get("AWS_ENDPOINT_URL") != endpoint:
            settings["AWS_ENDPOINT_URL"] = endpoint
    if session.region_name and not (environ.get("AWS_DEFAULT_REGION") or environ.get("AWS_REGION")):
        settings["AWS_DEFAULT_REGION"] = session.region_name
    has_keys = environ.get("AWS_ACCESS_KEY_ID") and environ.get("AWS_SECRET_ACCESS_KEY")
    credentials = None if has_keys else session.get_credentials()
    if credentials is not None and credentials.method == "shared-credentials-file" and \
            not environ.get("AWS_SHARED_CREDENTIALS_FILE"):
        path = core.get_config_variable("credentials_file")  # AWS_SHARED_CREDENTIALS_FILE or ~/.aws/credentials
        settings["AWS_SHARED_CREDENTIALS_FILE"] = os.path.expanduser(path)
        if session.profile_name and not environ.get("AWS_PROFILE"):
            settings["AWS_PROFILE"] = session.profile_name
    return settings


@contextlib.contextmanager
def s3_arrays(paths: Iterable[str]) -> Iterator[dict[str, str]]:
    """While a step reads or writes Levanter arrays at `paths`: when any is on `s3://`, boto3's S3 settings
    are in the environment Levanter reads (`s3_settings`), and the environment is restored after. Yields the
    variables set (names and values: endpoints, regions, file paths — never keys)."""
    if not any(scheme_of(p) == "s3" for p in paths):
        yield {}
        return
    settings = s3_settings()
    before = {name: os.environ.get(name) for name in settings}
    os.environ.update(settings)
    try:
        yield settings
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
