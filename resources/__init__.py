"""Dagster resources: the settings of where outputs live, where work runs, and how a model is served."""

from resources.ray import RayResource
from resources.serving import ServingResource
from resources.storage import StorageResource

__all__ = ["RayResource", "ServingResource", "StorageResource"]
