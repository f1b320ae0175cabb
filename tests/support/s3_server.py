"""A local S3 for tests: moto's server mode (PyPI `moto[server]`) on loopback, and a proxy in front of
it that drops chosen request headers — an S3-compatible store that ignores conditional writes.

Clients find the server through the standard AWS variables (`AWS_ENDPOINT_URL_S3`, test keys, a
region), read by boto3 and s3fs alike, so subprocesses use it with no code change. moto honours
`If-None-Match: *` and `If-Match: <etag>` on PutObject (412 when they fail) and `If-Match` on
DeleteObject; it checks no signatures, so the proxy may drop headers the client signed. Its check and write are made
one step (`atomic_moto.py`), as on S3.
"""

import contextlib
import http.client
import http.server
import os
import subprocess
import sys
from pathlib import Path

from tests.support.servers import free_port, serve_http, wait_until_serving

ATOMIC_MOTO = Path(__file__).with_name("atomic_moto.py")
"""moto's server, its conditional writes atomic as S3's are (a create race has one winner)."""


def s3_env(url: str) -> dict[str, str]:
    """boto3 and s3fs read these; the keys are moto's dummies, and no instance metadata is asked for."""
    return {"AWS_ENDPOINT_URL_S3": url, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
            "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}



@contextlib.contextmanager
def moto_s3_server(log_path: Path):
    """Yields the server's URL; its log goes to `log_path` (never to an unread pipe)."""
    port = free_port()
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, str(ATOMIC_MOTO), "-H", "127.0.0.1", "-p", str(port)],
                                stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_serving(f"{url}/moto-api/", proc, log_path, 120, "moto_server")
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def use_s3_server(url: str) -> None:
    """Point this process's S3 clients at `url` (fsspec caches filesystems: clear them)."""
    import s3fs

    os.environ.update(s3_env(url))
    s3fs.S3FileSystem.clear_instance_cache()


@contextlib.contextmanager
def header_dropping_proxy(upstream: str, drop: tuple[str, ...]):
    """Yields the URL of a proxy to `upstream` that forwards every request without the headers in
    `drop` (lower case): the store behind it sees plain writes where the client sent conditional ones."""
    target = upstream.removeprefix("http://")

    class Forward(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def forward(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            headers = {k: v for k, v in self.headers.items() if k.lower() not in drop and k.lower() != "host"}
            conn = http.client.HTTPConnection(target, timeout=30)
            try:
                conn.request(self.command, self.path, body=body, headers=headers)
                response = conn.getresponse()
                data = response.read()
            finally:
                conn.close()
            self.send_response(response.status)
            length = response.getheader("Content-Length") if self.command == "HEAD" else str(len(data))
            for k, v in response.getheaders():
                if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                    self.send_header(k, v)
            self.send_header("Content-Length", length or "0")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = forward

        def log_message(self, format, *args) -> None:  # noqa: A002 - the base class's name
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Forward)
    server.daemon_threads = True
    with serve_http(server) as url:
        yield url
