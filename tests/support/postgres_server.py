"""A real PostgreSQL server on loopback for tests: Debian's package, a throwaway cluster.

As root the cluster belongs to the `postgres` user (PostgreSQL refuses to run as root); the
package is installed with apt if it is missing.
"""

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import tempfile


def _bin_dir() -> str:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not found and os.geteuid() == 0 and shutil.which("apt-get"):
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        subprocess.run(["apt-get", "update", "-q"], check=True, env=env, stdout=subprocess.DEVNULL)
        subprocess.run(["apt-get", "install", "-y", "-q", "--no-install-recommends", "postgresql"], check=True,
                       env=env, stdout=subprocess.DEVNULL)
        found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not found:
        raise RuntimeError("PostgreSQL server binaries not found: apt-get install postgresql")
    return os.path.dirname(found[-1])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def postgres_server(db_name: str = "dagster"):
    """Yields (host, port, user, db_name) of a fresh server with a trusted `postgres` user."""
    bin_dir = _bin_dir()
    root = tempfile.mkdtemp(prefix="marin-pg-")
    os.chmod(root, 0o755)
    data = os.path.join(root, "data")
    as_root = os.geteuid() == 0
    prefix = ["runuser", "-u", "postgres", "--"] if as_root else []
    if as_root:
        shutil.chown(root, "postgres")
    port = _free_port()
    try:
        subprocess.run(prefix + [f"{bin_dir}/initdb", "-D", data, "-A", "trust", "-U", "postgres"], check=True,
                       stdout=subprocess.DEVNULL)
        subprocess.run(prefix + [f"{bin_dir}/pg_ctl", "-D", data, "-l", os.path.join(root, "server.log"), "-w",
                                 "-o", f"-h 127.0.0.1 -p {port} -k {root}", "start"], check=True,
                       stdout=subprocess.DEVNULL)
        subprocess.run(["psql", "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "-q", "-c",
                        f"CREATE DATABASE {db_name}"], check=True)
        yield "127.0.0.1", port, "postgres", db_name
    finally:
        subprocess.run(prefix + [f"{bin_dir}/pg_ctl", "-D", data, "-m", "fast", "-w", "stop"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        shutil.rmtree(root, ignore_errors=True)
