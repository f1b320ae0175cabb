"""The train–test overlap of the demo: how much of what the demo model is scored on it was trained on.

Rows: the shipped lm-eval tasks (`resources/eval_tasks/pydocs_*`, sentences of packages the demo holds out,
each scored document as its prompt and gold answer) and the demo's own validation split (the text its loss and
bits per byte are measured on). Columns: the training datasets of the demo model's lineage
(`training_datasets_of`: the text its tokenize step read, `raw/python-docs`' train split) and their union.
The data alone decides it: the report depends on the datasets, not on the trained model, so it is ready before
training starts. `python -m marin_assets.experiments.overlap_demo` materializes it under the storage prefix and
prints the matrix.
"""

from __future__ import annotations

from collections.abc import Mapping

from marin_assets import Experiment, Step
from marin_assets.experiments import python_docs
from marin_assets.steps import TokenizeStep, overlap_step, shipped_tasks, training_datasets_of


def build(pipeline: Mapping[str, Step], prefix: str) -> Step:
    """The overlap of the shipped tasks and the pipeline's validation split with its model's training data,
    `reports/{prefix}-overlap`."""
    tokenized = pipeline["tokenized"]
    assert isinstance(tokenized, TokenizeStep), "tokenize_step makes a TokenizeStep"
    return overlap_step(f"reports/{prefix}-overlap", [*shipped_tasks(), tokenized],
                        training_datasets_of(pipeline["train"]))


overlap = build(python_docs.pipeline, "python-docs")
steps = [overlap]
experiment = Experiment("python-docs-overlap", steps)


def main() -> None:
    """Materialize the overlap report (and the corpus it reads) here, and print the matrix."""
    from marin_assets.core.materialize import materialize_step
    from marin_assets.core.step import walk

    for step in walk([overlap]):
        result = materialize_step(step).record.result
    for eval_set, row in result["matrix"].items():
        examples = result["eval_sets"][eval_set]["examples"]
        print(f"{eval_set} ({examples} examples): " + ", ".join(f"{k} {v:.4f}" for k, v in row.items()))
    for hit in result["hits"]:
        print(f"  {hit['eval_set']} #{hit['example']} in {hit['train']} ({hit['file'].rsplit('/', 1)[-1]}:"
              f"{hit['line']}): {hit['ngram']!r}")


if __name__ == "__main__":
    main()
