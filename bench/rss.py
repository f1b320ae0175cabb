"""Resident memory of a data phase, above what the process already held: what a leak proportional to the
data would grow, with the imports, libraries and loaded models (already resident) left out.

    with DataPeak() as peak:
        work()
    peak.data_mb   # peak anonymous RSS during the block − anonymous RSS when it began

Anonymous memory (`RssAnon`: heap, arenas, numpy and Rust buffers) is what a leak grows; file-backed
resident pages (`RssFile`: files mapped while they are written or read, reclaimable page cache) grow with
the output however well the code behaves, so they are reported beside it, not in it. A thread samples
both every 5 ms (it can miss a spike shorter than that). The whole RSS is also taken exactly: Linux keeps
a process's resident high-water mark (VmHWM); writing 5 to /proc/self/clear_refs resets it to the
current RSS, so the mark read at the end is the peak of the block (`total_mb`, where that file can be
written). Every figure covers all threads of the process, not child processes.
"""

from __future__ import annotations

import gc
import threading


def _status() -> dict[str, int]:
    """/proc/self/status' memory fields, in bytes."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:", "RssAnon:", "RssFile:")):
                name, value = line.split(":", 1)
                out[name] = int(value.split()[0]) * 1024
    return out


def _reset_high_water_mark() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class DataPeak:
    """Peak memory above the memory at entry, during the `with` block, in MB: `data_mb` (anonymous RSS: the
    figure), `file_mb` (file-backed RSS), `total_mb` (the whole RSS); each its own peak. `baseline_mb`: the
    whole RSS at entry."""

    def __enter__(self) -> DataPeak:
        gc.collect()
        self.baseline = _status()
        self.exact = _reset_high_water_mark()
        self._peak = dict(self.baseline)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _observe(self) -> None:
        now = _status()
        for name in ("VmRSS", "RssAnon", "RssFile"):
            self._peak[name] = max(self._peak[name], now[name])

    def _sample(self) -> None:
        while not self._stop.wait(0.005):
            self._observe()

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._observe()
        total = max(self._peak["VmRSS"], _status()["VmHWM"]) if self.exact else self._peak["VmRSS"]
        mb = 2**20
        self.baseline_mb = self.baseline["VmRSS"] / mb
        self.data_mb = (self._peak["RssAnon"] - self.baseline["RssAnon"]) / mb
        self.file_mb = (self._peak["RssFile"] - self.baseline["RssFile"]) / mb
        self.total_mb = (total - self.baseline["VmRSS"]) / mb
        self.method = "RssAnon sampled every 5 ms" + ("; VmHWM reset at the start" if self.exact else "")

    def as_json(self) -> dict[str, float | str]:
        return {"baseline_mb": round(self.baseline_mb, 1), "data_mb": round(self.data_mb, 1),
                "file_mb": round(self.file_mb, 1), "total_mb": round(self.total_mb, 1), "method": self.method}
