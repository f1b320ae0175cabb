"""Dagster resources: the settings of where outputs live and where work runs."""

from resources.ray import RayResource
from resources.storage import StorageResource

__all__ = ["RayResource", "StorageResource"]
