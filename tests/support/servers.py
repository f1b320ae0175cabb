"""Local servers speaking real protocols, for tests: a static HTTP file server; ports for servers started
as subprocesses (`free_port`) and a readiness probe for them (`wait_until_serving`)."""

import contextlib
import fcntl
import functools
import http.server
import os
import random
import socket
import tempfile
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


PORTS_DIR = os.path.join(tempfile.gettempdir(), "marin-test-ports")
"""Lock files reserving the ports `free_port` hands out, one per port, shared by every test process here."""
_reserved: dict[int, int] = {}
"""Ports this process reserved -> the open lock file holding each (closed, and so released, at exit)."""
_reserve_lock = threading.Lock()


def _unassigned_range() -> tuple[int, int]:
    """Ports the kernel never picks by itself: below its ephemeral range (port 0 binds and outgoing
    connections take theirs from that range), above the usual fixed ones (Ray's workers use 10002-19999)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    return (20000, low) if low - 20000 >= 1000 else (low // 2, low)


def free_port() -> int:
    """A loopback port nothing listens on, reserved for this process for its lifetime: no other test process
    on this machine (pytest-xdist workers, other sessions) gets it from `free_port`.

    For servers that must be told their port (a subprocess: moto, fake-gcs-server, `dagster dev`, Ray). A
    plain "bind port 0, close, return the number" leaves a window in which another worker binding port 0
    gets the same number, and the second server either fails or, worse, its readiness probe is answered by
    the first. Here the port comes from outside the kernel's ephemeral range (nothing takes one from there
    without asking for it by number) and is claimed with an exclusive lock on `PORTS_DIR/<port>.lock` before
    it is returned, so two callers never share one. A server that can bind port 0 itself and report the port
    (`serve_http`, the Hub emulator) needs none of this.
    """
    os.makedirs(PORTS_DIR, exist_ok=True)
    low, high = _unassigned_range()
    pick = random.SystemRandom()
    with _reserve_lock:
        for _ in range(1000):
            port = pick.randrange(low, high)
            if port in _reserved:
                continue
            fd = os.open(os.path.join(PORTS_DIR, f"{port}.lock"), os.O_CREAT | os.O_RDWR, 0o666)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:  # another process holds it
                os.close(fd)
                continue
            if _bindable(port):
                _reserved[port] = fd
                return port
            os.close(fd)  # something outside the tests listens there: try another
    raise RuntimeError(f"no free port in {low}-{high} after 1000 tries")


def _bindable(port: int) -> bool:
    """Nothing is bound to `port` on any address now (a wildcard bind conflicts with each of them)."""
    with socket.socket() as s:
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


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
                how = f"exited with {proc.returncode}" if proc.poll() is not None else f"no answer in {timeout:g} s"
                raise RuntimeError(f"{what} did not start ({how}): {open(log_path).read()[-3000:]}") from None
            time.sleep(0.1)
