"""A pytest plugin (load with `-p tests.support.phase_times`) that records, per test phase, the wall
time and the CPU time spent: by the test process, by its reaped children (`getrusage`), and by every
descendant process (sampled with psutil every 0.2 s, so daemons such as Ray's and grandchildren that
nobody reaps count too). Wall ≫ CPU: the test waits; CPU high: it computes (or repeats work).
Rows go to the terminal summary and, if `PHASE_TIMES` names a file, are appended to it as TSV:
nodeid, phase, wall, cpu self, cpu reaped children, cpu all descendants (self included), and the programs
JAX compiled anew meanwhile (files added to the persistent compilation cache: misses, in every process)."""

import os
import resource
import threading
import time

import psutil
import pytest

_rows: list[tuple[str, str, float, float, float, float, int]] = []


class _Tree:
    """CPU seconds of this process and its descendants, sampled: pid → (create time, last CPU seen)."""

    def __init__(self):
        self.me = psutil.Process()
        self.seen: dict[tuple[int, float], float] = {}
        self.lock = threading.Lock()
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self):
        while True:
            self.sample()
            time.sleep(0.2)

    def sample(self):
        try:
            procs = [self.me, *self.me.children(recursive=True)]
        except psutil.Error:
            return
        for p in procs:
            try:
                t = p.cpu_times()
                key = (p.pid, p.create_time())
            except psutil.Error:
                continue
            with self.lock:
                self.seen[key] = t.user + t.system  # own only: children's are their own entries

    def total(self) -> float:
        self.sample()
        with self.lock:
            return sum(self.seen.values())


_tree: _Tree | None = None


def _compiled() -> int:
    folder = os.environ.get("JAX_COMPILATION_CACHE_DIR")
    return len(os.listdir(folder)) if folder and os.path.isdir(folder) else 0


def _cpu() -> tuple[float, float]:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, kids.ru_utime + kids.ru_stime


def _timed(phase: str):
    @pytest.hookimpl(hookwrapper=True)
    def hook(item, *args, **kwargs):
        global _tree
        if _tree is None:
            _tree = _Tree()
        wall, (own, kids), tree, compiled = time.perf_counter(), _cpu(), _tree.total(), _compiled()
        yield
        own2, kids2 = _cpu()
        _rows.append((item.nodeid, phase, time.perf_counter() - wall, own2 - own, kids2 - kids, _tree.total() - tree,
                      _compiled() - compiled))

    return hook


pytest_runtest_setup = _timed("setup")
pytest_runtest_call = _timed("call")
pytest_runtest_teardown = _timed("teardown")


def pytest_terminal_summary(terminalreporter):
    rows = sorted(_rows, key=lambda r: -r[2])
    out = os.environ.get("PHASE_TIMES")
    if out:
        with open(out, "a") as f:
            for r in rows:
                f.write("\t".join([r[0], r[1], *(f"{x:.1f}" for x in r[2:6]), str(r[6])]) + "\n")
    terminalreporter.write_line("phase times (s): wall, cpu self, cpu reaped children, cpu all descendants;"
                                " programs compiled anew")
    for nodeid, phase, wall, own, kids, tree, compiled in rows[:30]:
        terminalreporter.write_line(f"{wall:7.1f} {own:7.1f} {kids:7.1f} {tree:7.1f} {compiled:4d} {phase:8s} {nodeid}")
    terminalreporter.write_line(f"total: wall {sum(r[2] for r in rows):.1f}, cpu self {sum(r[3] for r in rows):.1f},"
                                f" reaped {sum(r[4] for r in rows):.1f}, tree {sum(r[5] for r in rows):.1f},"
                                f" compiled {sum(r[6] for r in rows)}")
