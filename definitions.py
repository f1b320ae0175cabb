"""The Dagster definitions of this project: `dagster dev` and `dagster asset materialize` load this."""

from marin_assets import build_definitions
from marin_assets.experiments import hello_world
from resources import StorageResource

defs = build_definitions(hello_world.steps, resources={"storage": StorageResource()})
