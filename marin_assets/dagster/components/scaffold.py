"""What `dg scaffold defs marin_assets.dagster.components.LanguageModelExperiment <path>` writes: a `defs.yaml` that
loads as it is — a small run on the running Python's documentation (offline) —
with the other choices of each block in comments. `--name` sets the step-name prefix (default: the folder's name),
`--sweep` writes a learning-rate sweep instead of one run."""

from __future__ import annotations

import re

import dagster as dg
from pydantic import BaseModel

TEMPLATE = """\
type: {type_name}

# A standard experiment in plain settings (marin_assets/dagster/components/settings.py has every field). Its steps
# are the Python factories' own, with the identities of the same experiment written in Python, named after `name`:
# raw/{name}, tokenizers/{name}-bpe, tokenized/{name}-bpe,
# {runs}.
attributes:
  name: {name}
  corpus:
    python_docs: {{}}                 # the running Python's documentation (offline); or one of:
    # huggingface: {{repo_id: org/dataset, revision: <40-hex commit>, include: ["train/*", "validation/*"]}}
    # urls: [data/]                 # fsspec URLs or local paths (relative to this file) with train/ and validation/
    # text_field: text              # the field holding the text (JSON lines, parquet)
  tokenizer:
    bpe: {{vocab_size: 512}}          # trained on the corpus; or  existing: {{name_or_path: gpt2}}
  training:
    model: {{family: llama, hidden_dim: 64, intermediate_dim: 256, num_layers: 2, num_heads: 4, num_kv_heads: 4,
            seq_len: 128}}
    optimizer: {{learning_rate: 0.003}}
    trainer: {{num_train_steps: 50, train_batch_size: 8, checkpoint_every: 25, steps_per_eval: 25,
              max_eval_batches: 4}}
{tail}"""

ONE_RUN = """\
  export: true                      # a Hugging Face folder of the last checkpoint
  evaluate: true                    # loss and bits per byte on the validation split
  checkpoint_evals: false           # true: every checkpoint evaluated as it lands
  # validation:                     # suites every run is also scored on
  #   - {name: heldout, urls: [heldout/], sets: {docs: ["docs/*.jsonl"]}}
"""

SWEEP = """\
  sweep:                            # one run per model × learning rate, each evaluated
    learning_rates: [0.001, 0.003, 0.01]
    # models: {d32: {hidden_dim: 32, intermediate_dim: 128, num_heads: 2, num_kv_heads: 2, seq_len: 128}, d64: {…}}
"""


class ScaffoldParams(BaseModel):
    """`dg scaffold defs … --name NAME --sweep`."""

    name: str | None = None
    """The step-name prefix; default: the target folder's name."""
    sweep: bool = False
    """Write a learning-rate sweep instead of one run."""


def default_name(folder_name: str) -> str:
    """A step-name segment from a folder name (`my experiment` → `my-experiment`)."""
    return re.sub(r"[^A-Za-z0-9_.\-]", "-", folder_name).lstrip(".-") or "experiment"


class ExperimentScaffolder(dg.Scaffolder[ScaffoldParams]):
    """Writes `defs.yaml` into the target folder."""

    @classmethod
    def get_scaffold_params(cls) -> type[ScaffoldParams]:
        return ScaffoldParams

    def scaffold(self, request: dg.ScaffoldRequest[ScaffoldParams]) -> None:
        params = request.params or ScaffoldParams()
        name = params.name or default_name(request.target_path.name)
        runs = (f"checkpoints/{name}-llama-lr{{lr}} and evals/{name}-llama-lr{{lr}} per learning rate" if params.sweep
                else f"checkpoints/{name}-llama, exports/{name}-llama, evals/{name}-llama")
        request.target_path.mkdir(parents=True, exist_ok=True)
        (request.target_path / "defs.yaml").write_text(
            TEMPLATE.format(type_name=request.type_name, name=name, runs=runs, tail=SWEEP if params.sweep else ONE_RUN))
