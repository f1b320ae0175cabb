"""Step functions for the cluster tests, importable by the Ray head's workers."""

import os
import threading


def where(output_path):
    """Which cluster ran me: the head's workers carry MARIN_TEST_HEAD."""
    return {"head": os.environ.get("MARIN_TEST_HEAD"), "pid": os.getpid()}


def sleepy(output_path):
    """Announce my pid, then work until killed (the test interrupts it; it never finishes on its own)."""
    pid_dir = os.environ["PID_DIR"]
    with open(os.path.join(pid_dir, "sleepy.pid.tmp"), "w") as f:
        f.write(str(os.getpid()))
    os.replace(os.path.join(pid_dir, "sleepy.pid.tmp"), os.path.join(pid_dir, "sleepy.pid"))
    threading.Event().wait()
    open(os.path.join(pid_dir, "sleepy.done"), "w").close()  # never reached: the test checks it never appears


def on_each_host(output_path):
    """What every host of a TPU slice runs: note this host, report the TPU chips Ray gave it."""
    import ray

    os.makedirs(output_path, exist_ok=True)
    context = ray.get_runtime_context()
    # Named by the task, not the process: Ray may run both hosts' tasks in one reused worker.
    open(os.path.join(output_path, f"host-{context.get_task_id()}"), "w").close()
    ids = context.get_accelerator_ids().get("TPU", [])
    hosts = len([n for n in os.listdir(output_path) if n.startswith("host-")])
    return {"tpu_ids": ids, "hosts_seen": hosts, "pod": os.environ.get("TPU_NAME")}


def write_here(output_path):
    """Write into the output — a local path or a URL such as gs:// — from a worker of the cluster."""
    import fsspec

    with fsspec.open(f"{output_path}/written-by.txt", "w") as f:
        f.write(f"{os.environ.get('MARIN_TEST_HEAD')}:{os.getpid()}")
    return {"head": os.environ.get("MARIN_TEST_HEAD"), "pid": os.getpid()}
