"""Serving: a trained model behind OpenAI's API, for an asset's code (an evaluation that asks a served model, an
agentic task), as `marin-assets serve` serves it from the command line.

    @dg.asset(deps=[export])
    def answers(serving: ServingResource) -> None:
        with serving.serve(export) as server:
            client = openai.OpenAI(base_url=server.url, api_key="none")
            ...

The server runs in the asset's process while the block runs (Levanter's server, `marin_assets.pipeline.evals.
serving`); its settings are the resource's, so a deployment chooses the port and the engine's size.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from dagster import ConfigurableResource
from pydantic import Field

from marin_assets.core.step import Step
from marin_assets.pipeline.evals.serving import Served, checkpoint_at, served


class ServingResource(ConfigurableResource):
    """Serves a model step's output (a training run, an export, a Hub model or a conversion) or a model folder."""

    host: str = Field(default="127.0.0.1", description="Address the server listens on.")
    port: int = Field(default=0, description="Port; 0: a free one (the URL says which).")
    model_name: str = Field(default="marin", description="The model id clients ask for.")
    max_seqs: int = Field(default=16, description="Sequences the engine decodes together (speed, not answers).")

    @contextlib.contextmanager
    def serve(self, model: Step | str, checkpoint_step: int | None = None) -> Iterator[Served]:
        """`model` (a step, its output under the current storage prefix; or a path) served while the block runs."""
        target = model.output_path if isinstance(model, Step) else model
        name = model.name if isinstance(model, Step) else model
        with served(checkpoint_at(target, checkpoint_step), host=self.host, port=self.port,
                    model_name=self.model_name, max_seqs=self.max_seqs, who=f"the served model {name}") as server:
            yield server
