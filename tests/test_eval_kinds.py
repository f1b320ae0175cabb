"""The evaluation-kind seam: every kind (loss and bits per byte; lm-eval tasks; per-token log-probs; the perplexity
gap to a reference model) goes through the same generic steps — a final-checkpoint step and a per-checkpoint family
— and the same assertions: identity from the kind's own attributes, the training run found by type, the final step
and the partition of the same checkpoint computing the same numbers, table rows matching their columns, and reports
finding the evaluation by type; and the loss kind's bits per byte is the validation text's own."""

import math

import pytest

from marin_assets import StepDefinitionError, load_result, materialize_step
from marin_assets.core.record import read_record
from marin_assets.pipeline.data.text_files import expand_files, iter_documents
from marin_assets.pipeline.evals.harness import HarnessEval
from marin_assets.pipeline.evals.harness_tasks import shipped_tasks
from marin_assets.pipeline.evals.log_probs import LogProbsEval
from marin_assets.pipeline.evals.loss import LossEval
from marin_assets.pipeline.evals.models import model_ref
from marin_assets.pipeline.evals.perplexity_gap import PerplexityGapEval, TextSet
from marin_assets.pipeline.evals.steps import CheckpointEvals, EvalStep, eval_step
from marin_assets.pipeline.reports.experiment_summary import experiment_summary_step
from marin_assets.pipeline.tokens.tokenizer import load_hf_tokenizer
from marin_assets.pipeline.training.specs import ModelSpec, OptimizerSpec, TrainerSpec
from marin_assets.pipeline.training.training_run import TrainResult
from tests.support.helpers import trained_tiny_stories

TINY = ModelSpec(hidden_dim=32, intermediate_dim=64, num_layers=1, num_heads=2, num_kv_heads=2, seq_len=128)
SHORT = TrainerSpec(num_train_steps=6, train_batch_size=4, checkpoint_every=3, steps_per_eval=3, max_eval_batches=1)

KINDS = {
    "loss": lambda pipeline: LossEval({"stories": pipeline["tokenized"]}, max_eval_batches=1),
    "lm-eval": lambda pipeline: HarnessEval(tuple(shipped_tasks()), num_fewshot=1, limit=4),
    "log-probs": lambda pipeline: LogProbsEval(pipeline["tokenized"], max_docs=4),
    # each checkpoint against the run's export (its last checkpoint), on the corpus's validation text
    "perplexity-gap": lambda pipeline: PerplexityGapEval(model_ref("kinds", pipeline["export"]),
                                                         {"stories": TextSet(pipeline["corpus"])}, max_docs=4,
                                                         max_doc_bytes=400),
}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny model trained 6 steps (checkpoints 3 and 5) and exported, under a prefix exported as MARIN_PREFIX."""
    prefix = str(tmp_path_factory.mktemp("kinds") / "outputs")
    with trained_tiny_stories(prefix, prefix="kinds", train_documents=300, validation_documents=40, vocab_size=300,
                              model=TINY, trainer=SHORT, optimizer=OptimizerSpec(learning_rate=1e-2)) as pipeline:
        materialize_step(pipeline["export"], prefix=prefix)  # the perplexity gap's reference
        yield pipeline, prefix, load_result(pipeline["train"], TrainResult)


@pytest.mark.parametrize("kind_name", sorted(KINDS))
def test_every_kind_serves_a_final_step_and_partitions_alike(trained, kind_name):
    pipeline, prefix, result = trained
    kind, train = KINDS[kind_name](pipeline), pipeline["train"]
    last = result.checkpoint_steps[-1]
    final = eval_step(f"evals/kinds-{kind_name}", kind, train)
    family = CheckpointEvals(f"evals/kinds-{kind_name}-checkpoints", train, kind)
    partition = family.step(last)

    # identity: the kind's attributes and the checkpoint; the run is a dependency, or in hash_attrs
    assert isinstance(final, EvalStep) and isinstance(partition, EvalStep)
    assert final.evaluates is train and partition.evaluates is train and partition.eval_kind is kind
    assert final.hash_attrs == {**kind.identity(), "checkpoint_step": None}
    assert partition.hash_attrs == {"checkpoint_of": train.name_with_hash, **kind.identity(), "checkpoint_step": last}
    assert train in final.deps and train not in partition.deps
    assert {d.name for d in family.deps} == {d.name for d in kind.deps} == {d.name for d in partition.deps}
    assert family.step(last).hash == partition.hash != family.step(result.checkpoint_steps[0]).hash
    assert eval_step(f"evals/kinds-{kind_name}", kind, train, checkpoint_step=last).hash != final.hash

    # hosts are how, not what: a kind that spans them takes them, one identity; the others refuse them by name
    if kind.spans_hosts:
        wide = eval_step(f"evals/kinds-{kind_name}", kind, train, hosts=2)
        assert wide.resources.hosts == 2 and wide.hash == final.hash
        assert CheckpointEvals(family.name, train, kind, hosts=2).step(last).hash == partition.hash
    else:
        refused = f"{type(kind).__name__} .* runs on one host; it cannot span 2 hosts"
        with pytest.raises(StepDefinitionError, match=refused):
            eval_step(f"evals/kinds-{kind_name}", kind, train, hosts=2)
        with pytest.raises(StepDefinitionError, match=refused):
            CheckpointEvals(family.name, train, kind, hosts=2)

    # the same checkpoint through both steps gives the same numbers
    numbers = {}
    for step in (final, partition):
        outcome = materialize_step(step, prefix=prefix)
        recorded = read_record(outcome.output_path).result
        numbers[step.name] = kind.numbers(recorded)
        assert numbers[step.name] and all(math.isfinite(v) for v in numbers[step.name].values())
        assert set(kind.row(recorded)) == set(kind.columns())
        assert kind.summary_columns(recorded)
        for check in step.checks:
            assert check.fn(outcome.output_path, recorded).passed, check.name
    assert numbers[final.name] == pytest.approx(numbers[partition.name], rel=1e-5)

    # a report finds the evaluation by its type, whatever the kind, and shows the kind's columns
    summary = experiment_summary_step(f"reports/kinds-{kind_name}", [train, final])
    assert final in summary.deps
    row = load_result(materialize_step(summary, prefix=prefix).output_path).rows[0]
    assert row["evals"] == final.name
    columns = kind.summary_columns(read_record(final.output_path_under(prefix)).result)
    assert columns and {k: row[k] for k in columns} == columns


def test_bits_per_byte_is_the_loss_per_byte_of_the_validation_text(trained):
    """Levanter's bytes per token id (`levanter.utils.hf_utils.byte_length_of_token`, over the tokenizer as the
    model's vocabulary sees it: special tokens and unused ids count zero bytes) turn the loss into bits per byte:
    over the whole validation split, the loss in bits divided by bpb is the split's own bytes per token."""
    pipeline, prefix, result = trained
    step = eval_step("evals/kinds-bpb", LossEval({"stories": pipeline["tokenized"]}), pipeline["train"])
    scored = materialize_step(step, prefix=prefix).record.result
    tokenizer = load_hf_tokenizer(result.model_and_tokenizer()[1])
    texts = [text for _, _, text in iter_documents(
        expand_files(pipeline["corpus"].output_path_under(prefix), ["validation/*"]), "text", "auto")]
    assert texts and all(t.isascii() for t in texts)  # Levanter counts a token that is part of a character as 3
    tokens = sum(len(tokenizer(t).input_ids) for t in texts)  # with the EOS around each document, zero bytes
    text_bytes = sum(len(t.encode()) for t in texts)
    assert scored["per_dataset"]["stories"]["bpb"] == pytest.approx(scored["bpb"], rel=1e-6)
    assert scored["loss"] / math.log(2) / scored["bpb"] == pytest.approx(text_bytes / tokens, rel=2e-3)
