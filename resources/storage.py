"""Storage: the prefix under which every output lives, and how its leases behave."""

from __future__ import annotations

from dagster import ConfigurableResource
from pydantic import Field


class StorageResource(ConfigurableResource):
    """Where outputs live. The prefix is the only thing that changes between laptop and cluster.

    Leave `prefix` unset to use `MARIN_PREFIX`, else the project's `outputs/` folder.
    """

    prefix: str | None = Field(
        default=None,
        description="Output root: a local folder or a URL (gs://bucket/prefix). Unset: $MARIN_PREFIX, else ./outputs.",
    )
    heartbeat_interval: float = Field(default=30.0, description="Seconds between lease heartbeats.")
    stale_timeout: float = Field(
        default=90.0, description="A lease without a heartbeat for this long may be taken over."
    )
    poll_interval: float = Field(default=5.0, description="Seconds between checks while waiting for another holder.")
