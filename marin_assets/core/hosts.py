"""A step's place among the hosts it spans: how the runner tells each of a multi-host step's processes who it
is and where their coordinator listens, so that they join one JAX program.

The execution layer starts one process per host and passes this through the environment; the step's function
(a training) reads it and joins before JAX starts. One host: nothing is set and nothing changes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

COORDINATOR_ENV = "MARIN_JAX_COORDINATOR"
PROCESSES_ENV = "MARIN_JAX_PROCESSES"
PROCESS_ID_ENV = "MARIN_JAX_PROCESS_ID"


@dataclass(frozen=True)
class HostPlace:
    """One process of a step that spans `processes` hosts."""

    process_id: int
    """This process's index, 0 … processes − 1; process 0 writes the step's own files and gives its result."""
    processes: int
    """How many processes (one per host) the step spans."""
    coordinator: str | None
    """`host:port` where process 0's JAX coordinator listens; None: JAX finds it (a TPU slice's metadata)."""

    def env(self) -> dict[str, str]:
        env = {PROCESSES_ENV: str(self.processes), PROCESS_ID_ENV: str(self.process_id)}
        if self.coordinator:
            env[COORDINATOR_ENV] = self.coordinator
        return env

    @classmethod
    def from_env(cls) -> HostPlace | None:
        """This process's place, or None when the step runs on one host."""
        processes = int(os.environ.get(PROCESSES_ENV, "1") or 1)
        if processes <= 1:
            return None
        return cls(process_id=int(os.environ.get(PROCESS_ID_ENV, "0")), processes=processes,
                   coordinator=os.environ.get(COORDINATOR_ENV) or None)


def writes_own_files(place: HostPlace | None) -> bool:
    """Whether this process writes its step's own files (record, metrics, caches): on one host it does; of several,
    host 0 alone (every host still writes its part of a checkpoint)."""
    return place is None or place.process_id == 0
