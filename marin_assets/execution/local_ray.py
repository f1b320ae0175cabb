"""A local Ray that outlives one run: `marin-assets ray start` once, every run joins it, `marin-assets ray stop`.

An embedded Ray is started by each run that needs one (GCS, raylet, a worker: seconds, most of what an
unmarked step costs over a plain Dagster asset). This one is started the same way (`ray.init`, sized for
the machine) by a small background process, the *holder*, which keeps it until it is told to stop. The
holder writes where it is to `$DAGSTER_HOME/local-ray.json`; the Ray resource (`resources/ray.py`) joins
it when that file names a live holder, and otherwise starts an embedded Ray as before, saying why.

"Live" is checked, never assumed: the same boot, the holder's process alive and the very process that
wrote the file (its start time, so a reused pid does not count), and its GCS port answering. A file left
by a Ray that stopped or a machine that rebooted is stale: it is ignored (and `start`/`stop` remove it).
Stopping sends the holder SIGTERM: it shuts down the Ray it started — only those processes, none of
another Ray on the machine — and removes the file. Killed outright, its Ray's processes die with it
(Ray ties a head it starts to its driver's life), and the file it leaves is stale.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

FILE_NAME = "local-ray.json"
"""The address file, in `$DAGSTER_HOME`."""
HOLDER = "marin_assets.execution.local_ray"
"""What a holder's command line runs (`python -m HOLDER hold …`): how a live holder is recognised."""


@dataclass(frozen=True)
class LocalRay:
    """What the address file says: where the Ray is and which process holds it."""

    address: str
    """The GCS address (`host:port`) a driver joins with `ray.init(address=…)`."""
    node_id: str
    pid: int
    """The holder's process."""
    process_start: str
    """The holder's start time as the kernel counts it (empty where unknown): a reused pid differs."""
    boot_id: str
    """The boot the holder ran in (empty where unknown): after a reboot the file is stale."""
    started_at: float
    num_cpus: int
    session_dir: str | None = None


def default_object_store() -> int:
    """10 % of the machine's memory, within 256 MiB–2 GiB: small, steps pass paths rather than data."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return int(min(max(total * 0.10, 256 * 2**20), 2 * 2**30))


def default_temp_dir() -> str:
    """Ray's session folders under the temp folder, not the home folder (as for an embedded Ray)."""
    return os.path.join(tempfile.gettempdir(), f"marin-ray-{os.getuid()}")


def address_file(home: str | os.PathLike[str] | None = None) -> Path | None:
    """`<home or $DAGSTER_HOME>/local-ray.json`; None when there is no Dagster home to keep it in."""
    home = home or os.environ.get("DAGSTER_HOME")
    return Path(home) / FILE_NAME if home else None


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _process_start(pid: int) -> str:
    """The process's start time in clock ticks since boot (field 22 of /proc/<pid>/stat); empty where unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[1].split()[19]


def _is_holder(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # alive, someone else's: the start-time check decides
    try:
        return HOLDER in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return True  # no /proc: alive is all we can tell


def read(path: Path) -> LocalRay:
    """The address file's record (`ValueError` if it is not one)."""
    try:
        return LocalRay(**json.loads(path.read_text()))
    except (TypeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path} is not a local Ray address file ({e})") from None


def why_stale(info: LocalRay, timeout: float = 1.0) -> str | None:
    """Why the Ray `info` describes cannot be joined (None: it can)."""
    if info.boot_id and info.boot_id != _boot_id():
        return "the machine has rebooted since it started"
    if not _is_holder(info.pid):
        return f"its holder (pid {info.pid}) is not running"
    if info.process_start and _process_start(info.pid) != info.process_start:
        return f"pid {info.pid} is now another process"
    host, _, port = info.address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            pass
    except (OSError, ValueError) as e:
        return f"its GCS at {info.address} does not answer ({e})"
    return None


def find(home: str | os.PathLike[str] | None = None) -> tuple[LocalRay | None, str | None]:
    """(the live local Ray, None); (None, why the address file is stale); (None, None) when there is no file."""
    path = address_file(home)
    if path is None or not path.exists():
        return None, None
    try:
        info = read(path)
    except (OSError, ValueError) as e:
        return None, str(e)
    reason = why_stale(info)
    return (None, f"{path} is stale: {reason}") if reason else (info, None)


def _pid_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)  # our own child (tests): reap it
        if not _is_holder(pid):
            return True
        time.sleep(0.1)
    return False


def start(home: str | os.PathLike[str] | None = None, num_cpus: int | None = None,
          object_store_mb: int | None = None, temp_dir: str | None = None, timeout: float = 180.0) -> LocalRay:
    """Start a local Ray held by a background process (or return the one already running); wait until it is up."""
    path = address_file(home)
    if path is None:
        raise RuntimeError("marin-assets ray start: DAGSTER_HOME is not set (the address file is kept there)")
    running, stale = find(path.parent)
    if running is not None:
        return running
    if stale is not None:
        path.unlink(missing_ok=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    options = {"num_cpus": num_cpus or os.cpu_count() or 1,
               "object_store_memory": object_store_mb * 2**20 if object_store_mb else default_object_store(),
               "temp_dir": temp_dir or default_temp_dir()}
    log_path = path.with_suffix(".log")
    with open(log_path, "ab") as log:
        holder = subprocess.Popen([sys.executable, "-m", HOLDER, "hold", str(path), json.dumps(options)],
                                  stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                  start_new_session=True)  # outlives this command and its terminal
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if holder.poll() is not None:
            raise RuntimeError(f"the local Ray did not start (exit {holder.returncode}); its log, {log_path}:\n"
                               f"{log_path.read_text(errors='replace')[-3000:]}")
        if path.exists():
            with contextlib.suppress(OSError, ValueError):
                info = read(path)
                if info.pid == holder.pid:
                    return info
        time.sleep(0.1)
    holder.terminate()
    raise TimeoutError(f"the local Ray was not up after {timeout:.0f} s (log: {log_path})")


def stop(home: str | os.PathLike[str] | None = None, timeout: float = 60.0) -> str:
    """Stop the local Ray (its holder shuts down the Ray it started); what was done, as a sentence."""
    path = address_file(home)
    if path is None or not path.exists():
        return "no local Ray is running (no address file)"
    try:
        info = read(path)
    except (OSError, ValueError) as e:
        path.unlink(missing_ok=True)
        return f"removed an unreadable address file ({e})"
    reason = why_stale(info)
    if reason is not None and not (_is_holder(info.pid) and _process_start(info.pid) == info.process_start):
        path.unlink(missing_ok=True)
        return f"removed a stale address file: {reason}"
    os.kill(info.pid, signal.SIGTERM)
    if not _pid_gone(info.pid, timeout):
        os.kill(info.pid, signal.SIGKILL)  # its Ray's processes die with it
        _pid_gone(info.pid, 10)
    path.unlink(missing_ok=True)
    return f"stopped the local Ray at {info.address} (holder pid {info.pid})"


def describe(info: LocalRay) -> str:
    return (f"local Ray at {info.address}: node {info.node_id[:12]}, {info.num_cpus} CPUs, holder pid {info.pid},"
            f" up {time.time() - info.started_at:.0f} s")


def hold(path: Path, options: dict[str, Any]) -> None:
    """The holder: start Ray, write the address file, keep Ray until SIGTERM or SIGINT, then shut it down."""
    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(num_cpus=options["num_cpus"], object_store_memory=options["object_store_memory"],
             include_dashboard=False, log_to_driver=False, _temp_dir=options["temp_dir"])
    context = ray.get_runtime_context()
    session = os.path.join(context.get_temp_dir(), context.get_session_name())
    info = LocalRay(address=context.gcs_address, node_id=context.get_node_id(), pid=os.getpid(),
                    process_start=_process_start(os.getpid()), boot_id=_boot_id(), started_at=time.time(),
                    num_cpus=options["num_cpus"], session_dir=session)

    def finish(signum: int, frame: Any) -> None:
        with contextlib.suppress(OSError, ValueError):
            if read(path).pid == os.getpid():
                path.unlink()
        ray.shutdown()
        shutil.rmtree(session, ignore_errors=True)
        os._exit(0)

    signal.signal(signal.SIGTERM, finish)
    signal.signal(signal.SIGINT, finish)
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text(json.dumps(asdict(info)))
    os.replace(partial, path)  # readers see a whole file or none
    print(f"holding {describe(info)}", flush=True)
    while True:
        signal.pause()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`marin-assets ray start|stop|status`."""
    parser.add_argument("action", choices=("start", "stop", "status"))
    parser.add_argument("--num-cpus", type=int, help="start: CPUs Ray may use (default: all cores)")
    parser.add_argument("--object-store-mb", type=int, help="start: object store size (default: 10%% of RAM,"
                                                            " 256 MiB–2 GiB)")
    parser.set_defaults(fn=command)


def command(args: argparse.Namespace) -> int:
    """What `marin-assets ray ACTION` does; `status` exits 1 when no local Ray is running."""
    running, stale = find()
    if args.action == "start":
        info = running or start(num_cpus=args.num_cpus, object_store_mb=args.object_store_mb)
        print(f"{'already running: ' if running else ''}{describe(info)}; runs with DAGSTER_HOME="
              f"{os.environ.get('DAGSTER_HOME')} join it (stop it with `marin-assets ray stop`)")
        return 0
    if args.action == "stop":
        print(stop())
        return 0
    print(describe(running) if running else stale or "no local Ray is running: each run starts an embedded Ray")
    return 0 if running else 1


if __name__ == "__main__" and sys.argv[1:2] == ["hold"]:
    hold(Path(sys.argv[2]), json.loads(sys.argv[3]))
