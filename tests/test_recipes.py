"""The recipes (`marin_assets.steps.recipes`): the chain wired once makes the very steps the factories make by hand,
named by role; the demo, the stories pipeline and the YAML component build through it (identities pinned in
tests/test_pinned_identities.py, the YAML twins in tests/test_experiment_component.py)."""

import pytest

from marin_assets import StepDefinitionError
from marin_assets.core.step import walk
from marin_assets.steps import (
    LanguageModelPipeline,
    ModelSpec,
    OptimizerSpec,
    TrainerSpec,
    bpe_tokenizer_step,
    corpus_step,
    existing_tokenizer_step,
    export_step,
    language_model_pipeline,
    loss_checkpoint_evals,
    loss_eval_step,
    tokenize_step,
    tokenized_corpus,
    train_step,
    url_validation_suite,
)

MODEL = ModelSpec(hidden_dim=32, intermediate_dim=64, num_layers=1, num_heads=2, num_kv_heads=2, seq_len=128)
TRAINER = TrainerSpec(num_train_steps=8, train_batch_size=8, checkpoint_every=4, max_eval_batches=2)
OPTIMIZER = OptimizerSpec(learning_rate=1e-2)


def identities(steps) -> dict[str, str]:
    return {s.name: s.name_with_hash for s in walk(list(steps))}


def test_the_pipeline_is_the_chain_wired_by_hand_step_for_step():
    corpus = corpus_step("raw/r", 100, 10, seed=0)
    pipeline = language_model_pipeline("r", corpus, dataset="stories", vocab_size=300, model=MODEL, trainer=TRAINER,
                                       optimizer=OPTIMIZER)
    tokenizer = bpe_tokenizer_step("tokenizers/r-bpe", corpus, vocab_size=300)
    tokenized = tokenize_step("tokenized/r-bpe", corpus, tokenizer)
    train = train_step("checkpoints/r-llama", {"stories": tokenized}, MODEL, OPTIMIZER, TRAINER)
    by_hand = {"corpus": corpus, "tokenizer": tokenizer, "tokenized": tokenized, "train": train,
               "export": export_step("exports/r-llama", train),
               "evaluate": loss_eval_step("evals/r-llama", train, {"stories": tokenized})}
    assert list(pipeline) == list(by_hand)  # the roles, in the chain's order
    assert {k: s.name_with_hash for k, s in pipeline.items()} == {k: s.name_with_hash for k, s in by_hand.items()}
    assert pipeline.train is pipeline["train"] and pipeline.train_data == {"stories": pipeline.tokenized}
    family = pipeline.checkpoint_evals()
    twin = loss_checkpoint_evals("evals/r-llama-checkpoints", train, {"stories": tokenized}, max_eval_batches=2)
    assert (family.name, family.hash) == (twin.name, twin.hash)
    assert pipeline.checkpoint_evals(None).hash != family.hash  # all of each set: another evaluation


def test_an_existing_tokenizer_names_the_caches_and_suites_are_tokenized_with_it(tmp_path):
    corpus = corpus_step("raw/w", 100, 10, seed=0)
    gpt2 = existing_tokenizer_step("tokenizers/w-gpt2", "gpt2")
    suite = url_validation_suite("heldout", [str(tmp_path)], {"docs": ["*.jsonl"]})
    pipeline = language_model_pipeline("w", corpus, tokenizer=gpt2, model=MODEL, trainer=TRAINER, suites=[suite],
                                       export=False, gpu=1, gpu_type="H100")
    assert isinstance(pipeline, LanguageModelPipeline) and pipeline.export is None and "export" not in pipeline
    assert pipeline.tokenized.name == "tokenized/w-gpt2" and pipeline.tokenizer is gpt2
    assert pipeline.dataset == "w"  # the prefix, when no dataset is named
    validation = suite.tokenized(gpt2)
    assert identities(pipeline.validation.values()) == identities(validation.values())
    assert [k for k in pipeline if k.startswith("validation/")] == [f"validation/{k}" for k in validation]
    train = train_step("checkpoints/w-llama", {"w": pipeline.tokenized}, MODEL, OptimizerSpec(), TRAINER,
                       validation=validation, gpu=1, gpu_type="H100")
    assert pipeline.train.name_with_hash == train.name_with_hash
    assert pipeline.evaluate is not None and pipeline.evaluate.resources.gpu == 1  # on the run's GPUs
    assert pipeline.evaluate.name_with_hash == loss_eval_step("evals/w-llama", train,
                                                              {"w": pipeline.tokenized, **validation}).name_with_hash
    labeled = tokenized_corpus("w", corpus, tokenizer=gpt2, tokenizer_label="g2")
    assert labeled.tokenized.name == "tokenized/w-g2" and set(labeled) == {"corpus", "tokenizer", "tokenized"}


@pytest.mark.parametrize("given", [{}, {"vocab_size": 300, "tokenizer": "both"}])
def test_a_tokenizer_is_either_trained_or_given(given):
    corpus = corpus_step("raw/e", 100, 10, seed=0)
    if given.get("tokenizer") == "both":
        given["tokenizer"] = existing_tokenizer_step("tokenizers/e-gpt2", "gpt2")
    with pytest.raises(StepDefinitionError, match="`vocab_size`.*`tokenizer`"):
        language_model_pipeline("e", corpus, model=MODEL, **given)
