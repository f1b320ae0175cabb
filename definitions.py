"""The Dagster definitions of this project: `dagster dev` and `dagster asset materialize` load this."""

from marin_assets import build_definitions
from marin_assets.experiments import hello_world, tiny_stories
from resources import RayResource, StorageResource

defs = build_definitions(
    hello_world.steps + tiny_stories.steps,
    resources={"storage": StorageResource(), "ray": RayResource()},
)
