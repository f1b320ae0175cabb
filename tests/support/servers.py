"""Local servers speaking real protocols, for tests: a static HTTP file server."""

import contextlib
import functools
import http.server
import socket
import threading
import time
import urllib.error
import urllib.request


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


class ThrottledHandler(QuietHandler):
    """Sends bodies in 64 KiB chunks with a pause between them: a slow link, so a download
    can be interrupted half-way."""

    pause = 0.002

    def copyfile(self, source, outputfile):
        try:
            while chunk := source.read(64 * 1024):
                outputfile.write(chunk)
                time.sleep(self.pause)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client was killed mid-download: that is the point


@contextlib.contextmanager
def serve_directory(directory, throttled: bool = False):
    """http://127.0.0.1:PORT serving `directory` (with index pages, so globs work)."""
    handler = functools.partial(ThrottledHandler if throttled else QuietHandler, directory=str(directory))
    with serve_http(http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)) as url:
        yield url


@contextlib.contextmanager
def serve_http(server: http.server.HTTPServer):
    """Run `server` (bound to 127.0.0.1) in a daemon thread; yields its http://127.0.0.1:PORT URL."""
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def free_port() -> int:
    """A loopback port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_serving(url: str, proc, log_path, timeout: float, what: str) -> None:
    """Poll `url` until the server answers (any HTTP status counts); fail with the end of its log if `proc`
    exits first or `timeout` seconds pass."""
    deadline = time.time() + timeout
    while True:
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except urllib.error.HTTPError:
            return  # it answers
        except OSError:
            if proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"{what} did not start: {open(log_path).read()[-3000:]}") from None
            time.sleep(0.1)
