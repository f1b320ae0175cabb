"""Curate, then train: the planted documentation corpus through Marin's curation stages into a small LM.

raw (real Python documentation with planted duplicates, junk and evaluation-set paragraphs,
`pipeline/curation/planted.py`) → normalize → heuristic filters → quality classifier filter →
exact dedup → fuzzy dedup (MinHash + verification) → decontamination
against the two planted evaluation sets → BPE tokenizer → Levanter cache → small Llama → export
and evaluation. Every curation asset records what it removed and why; its check fails if it
removed more than half of its input.
"""

from __future__ import annotations

from marin_assets import Experiment, Step
from marin_assets.steps import (
    PLANTED_EVAL_SETS,
    EvalSet,
    ModelSpec,
    OptimizerSpec,
    TrainerSpec,
    decontaminate_step,
    exact_dedup_step,
    fuzzy_dedup_step,
    heuristic_filter_step,
    language_model_pipeline,
    normalize_step,
    planted_corpus_step,
    quality_classifier_step,
    quality_filter_step,
)

DATASET = "curated-docs"
MODEL = ModelSpec(family="llama", hidden_dim=64, intermediate_dim=256, num_layers=2, num_heads=4, num_kv_heads=4,
                  seq_len=128)
TRAINER = TrainerSpec(num_train_steps=40, train_batch_size=8, checkpoint_every=20, steps_per_eval=20,
                      max_eval_batches=4)


def curation(prefix: str = DATASET, seed: int = 0, shard_bytes: int = 100_000) -> dict[str, Step]:
    """The curation chain, raw to decontaminated, named `raw/{prefix}` … `curated/{prefix}-decontaminated`."""
    raw = planted_corpus_step(f"raw/{prefix}", seed)
    normalized = normalize_step(f"curated/{prefix}-normalized", raw, splits={"train": ["train/*"],
                                                                             "validation": ["validation/*"]},
                                target_shard_bytes=shard_bytes)
    labeled = {label: normalize_step(f"curated/{prefix}-{label}", raw, splits={"train": [f"labeled/{label}/train/*"]})
               for label in ("positive", "negative")}
    classifier = quality_classifier_step(f"classifiers/{prefix}-quality", labeled["positive"], labeled["negative"])
    heuristics = heuristic_filter_step(f"curated/{prefix}-heuristics", normalized)
    quality = quality_filter_step(f"curated/{prefix}-quality", heuristics, classifier, threshold=0.5)
    exact = exact_dedup_step(f"curated/{prefix}-exact-dedup", quality)  # line-level dedup would cut near-copies apart
    fuzzy = fuzzy_dedup_step(f"curated/{prefix}-fuzzy-dedup", exact)
    decontaminated = decontaminate_step(f"curated/{prefix}-decontaminated", fuzzy,
                                        [EvalSet(name, raw, (f"evalsets/{name}.jsonl",)) for name in PLANTED_EVAL_SETS])
    return {"raw": raw, "normalized": normalized, **{f"labeled_{k}": v for k, v in labeled.items()},
            "classifier": classifier, "heuristics": heuristics, "quality": quality, "exact": exact, "fuzzy": fuzzy,
            "decontaminated": decontaminated}


def build(prefix: str = DATASET, seed: int = 0, vocab_size: int = 512, model: ModelSpec = MODEL,
          trainer: TrainerSpec = TRAINER, optimizer: OptimizerSpec = OptimizerSpec()) -> dict[str, Step]:
    """Curation, then the language-model pipeline on the curated corpus (its `corpus` is the decontaminated one)."""
    curated = curation(prefix, seed)
    return {**curated, **language_model_pipeline(prefix, curated["decontaminated"], dataset=DATASET,
                                                 vocab_size=vocab_size, model=model, trainer=trainer,
                                                 optimizer=optimizer)}


pipeline = build()
steps = [pipeline["export"], pipeline["evaluate"]]
experiment = Experiment("curated-docs", steps)


def main() -> None:
    """`python -m marin_assets.experiments.curated_docs`: materialize the curation chain (not the training)
    under the storage prefix, in this process, and print what each stage removed."""
    from marin_assets.core.materialize import materialize_step
    from marin_assets.core.step import walk

    for step in walk([pipeline["decontaminated"]]):
        result = materialize_step(step).record.result
        if isinstance(result, dict) and "removed" in result:
            removed = ", ".join(f"{k}: {v['documents']}" + (f" (+{v['modified']} modified)" if v["modified"] else "")
                                for k, v in result["removed"].items()) or "nothing"
            print(f"{step.name}: {result['documents_in']} → {result['documents_out']} documents; removed {removed}")


if __name__ == "__main__":
    main()
