"""Downstream evaluation with lm-evaluation-harness on a real (tiny) Levanter checkpoint: the step's scores are
lm-eval's own, the few-shot count is checked, task files are identity, bad tasks fail by name, and every
checkpoint is evaluated as a Dagster partition."""

import json
import math
import shutil

import dagster as dg
import pytest

from marin_assets import build_definitions, load_result, materialize_step
from marin_assets.core.step import StepDefinitionError
from marin_assets.pipeline.evals.harness import (
    BOOTSTRAP_ITERS,
    RESULTS_FILE,
    HarnessEvalError,
    HarnessResult,
    evaluate_harness,
    harness_checkpoint_evals,
    harness_eval_step,
)
from marin_assets.pipeline.evals.harness_tasks import (
    SHIPPED_TASKS_DIR,
    HarnessTaskError,
    harness_task,
    shipped_tasks,
)
from marin_assets.pipeline.evals.levanter_harness import harness_model
from marin_assets.pipeline.evals.loss import loss_checkpoint_evals
from marin_assets.pipeline.training.export import ExportResult
from marin_assets.pipeline.training.specs import ModelSpec, OptimizerSpec, TrainerSpec
from marin_assets.pipeline.training.training_run import TrainResult
from tests.support.helpers import trained_tiny_stories

TINY = ModelSpec(hidden_dim=32, intermediate_dim=64, num_layers=1, num_heads=2, num_kv_heads=2, seq_len=256)
SHORT = TrainerSpec(num_train_steps=12, train_batch_size=4, checkpoint_every=5, steps_per_eval=6, max_eval_batches=2)
LIMIT = 12


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny model trained 12 steps (checkpoints 5, 10, 11) under a prefix exported as MARIN_PREFIX."""
    prefix = str(tmp_path_factory.mktemp("harness") / "outputs")
    with trained_tiny_stories(prefix, prefix="h", train_documents=800, validation_documents=60, vocab_size=400,
                              model=TINY, trainer=SHORT, optimizer=OptimizerSpec(learning_rate=1e-2)) as pipeline:
        yield pipeline, prefix, load_result(pipeline["train"], TrainResult)


@pytest.fixture(scope="module")
def evaluated(trained):
    """The shipped tasks, 2-shot, on the last checkpoint, through the step."""
    pipeline, prefix, _ = trained
    step = harness_eval_step("evals/h-harness", pipeline["train"], shipped_tasks(), num_fewshot=2, limit=LIMIT)
    outcome = materialize_step(step, prefix=prefix)
    return step, outcome


def copy_task(name: str, where) -> str:
    """A shipped task's folder copied to `where`; returns its YAML's path."""
    shutil.copytree(SHIPPED_TASKS_DIR / name, where / name)
    return str(where / name / f"{name}.yaml")


def test_the_steps_scores_equal_a_direct_lm_eval_run_on_the_same_checkpoint(trained, evaluated, tmp_path,
                                                                            monkeypatch):
    import lm_eval
    from lm_eval.tasks import TaskManager
    from lm_eval.tasks._yaml_loader import load_yaml
    from lm_eval.utils import handle_non_serializable

    _, _, result = trained
    step, outcome = evaluated
    scored = load_result(step, HarnessResult)
    with open(f"{outcome.output_path}/{RESULTS_FILE}") as f:
        saved = json.load(f)
    assert scored.step == 11 and scored.num_fewshot == 2 and set(scored.tasks) == {t.name for t in shipped_tasks()}

    model, tokenizer = result.model_and_tokenizer()
    monkeypatch.setenv("DISABLE_MULTIPROC", "1")  # lm-eval's perplexity bootstrap would fork this JAX process
    with harness_model(result.checkpoint_path(), model, tokenizer, result.vocab_size) as lm:
        for task in shipped_tasks():
            # lm-eval alone, on the task's own YAML: its data files resolve against the working directory
            monkeypatch.chdir(task.folder)
            config = load_yaml(task.yaml)
            config["dataset_kwargs"] = {**config["dataset_kwargs"], "cache_dir": str(tmp_path / "datasets")}
            direct = lm_eval.simple_evaluate(model=lm, tasks=[config], num_fewshot=2, limit=LIMIT,
                                             bootstrap_iters=BOOTSTRAP_ITERS,
                                             task_manager=TaskManager(include_defaults=False))
            name = task.name
            assert direct["results"][name] == saved["results"][name]  # every metric and stderr, exactly
            assert direct["n-shot"][name] == saved["n-shot"][name] == 2
            assert direct["n-samples"][name] == saved["n-samples"][name] == {"original": 100, "effective": LIMIT}
            score = scored.tasks[name]
            assert score.acc == direct["results"][name]["acc,none"] and score.samples == LIMIT
            assert score.num_fewshot == 2 and score.output_type == task.output_type
            # each document's prompt, choices and loglikelihoods too
            ours = [json.loads(line) for line in open(f"{outcome.output_path}/samples/{name}.jsonl")]
            theirs = json.loads(json.dumps(direct["samples"][name], default=handle_non_serializable))
            assert [r["resps"] for r in ours] == [r["resps"] for r in theirs]
            assert [r["arguments"] for r in ours] == [r["arguments"] for r in theirs]
            context, continuation = ours[0]["arguments"][0]
            assert context.count("\n\n") == 2 and continuation.startswith(" ")  # two examples before the question
            assert "  " not in context  # the delimiter is the target's own space, once
    mc = scored.tasks["pydocs_next_sentence"]
    assert mc.acc_norm is not None and mc.acc_stderr > 0 and mc.perplexity is None
    ll = scored.tasks["pydocs_last_word"]
    assert ll.output_type == "loglikelihood" and ll.perplexity > 1 and ll.acc_norm is None
    assert (outcome.record.result["tasks"]["pydocs_next_sentence"]["acc"] == mc.acc)


def test_an_export_scores_as_its_checkpoint(trained, evaluated):
    pipeline, prefix, _ = trained
    step = harness_eval_step("evals/h-harness-hf", pipeline["train"], shipped_tasks()[:1], num_fewshot=2,
                             limit=LIMIT, export=pipeline["export"])
    assert step.deps == (pipeline["train"], pipeline["export"])
    materialize_step(pipeline["export"], prefix=prefix)
    outcome = materialize_step(step, prefix=prefix)
    assert outcome.record.result["checkpoint"] == load_result(pipeline["export"], ExportResult).path
    name = "pydocs_next_sentence"
    from_checkpoint = evaluated[1]
    assert outcome.record.result["tasks"][name]["acc"] == from_checkpoint.record.result["tasks"][name]["acc"]

    def loglikelihoods(out):
        with open(f"{out}/samples/{name}.jsonl") as f:
            return [float(r[0][0]) for line in f for r in json.loads(line)["resps"]]

    ours, theirs = loglikelihoods(outcome.output_path), loglikelihoods(from_checkpoint.output_path)
    assert len(ours) == 4 * LIMIT and all(math.isclose(a, b, abs_tol=1e-4) for a, b in zip(ours, theirs, strict=True))


def test_the_model_scores_a_continuation_as_a_plain_forward_pass_does(trained):
    """`levanter.eval_harness._LmEvalHarnessWorker` (private) scores requests packed several to a sequence of the
    model's training length; each equals the log-probability of the continuation's tokens after the document-start
    token and the context."""
    import haliax as hax
    import jax
    import jax.numpy as jnp
    from levanter.eval_harness import LevanterHarnessLM
    from levanter.layers.attention import AttentionMask
    from lm_eval.api.instance import Instance

    _, _, result = trained
    model, tokenizer_path = result.model_and_tokenizer()
    pairs = [("Once upon a time", " there was a little dog."), ("The cat sat on the", " mat"),
             ("", "Hello there"), ("Lily and Tom went to the park. They", " played with a ball."),
             (("The dog ran to the park and played. " * 60)[:-1], " The end.")]  # longer than the model: cut
    requests = [Instance("loglikelihood", {}, pair, i) for i, pair in enumerate(pairs)]
    try:
        with harness_model(result.checkpoint_path(), model, tokenizer_path, result.vocab_size, batch_size=2) as lm:
            scored = lm.loglikelihood(requests)
            tok, net, Pos = lm.tokenizer, lm.leader.model, lm.EvalPos
            assert Pos.size == model.seq_len  # the length it was trained at, not the model's largest
            plain = []
            for context, continuation in pairs:
                whole = tok(context + continuation, add_special_tokens=False).input_ids
                ids = ([tok.bos_token_id] + whole)[-Pos.size:]
                start = len(ids) - (len(whole) - len(tok(context, add_special_tokens=False).input_ids))
                tokens = hax.named(jnp.array(ids + [0] * (Pos.size - len(ids))), Pos)
                logits = net(tokens, attn_mask=AttentionMask.causal()).array.astype(jnp.float32)
                logp = jax.nn.log_softmax(logits, axis=-1)
                plain.append((sum(float(logp[i - 1, ids[i]]) for i in range(start, len(ids))),
                              all(int(jnp.argmax(logits[i - 1])) == ids[i] for i in range(start, len(ids)))))
            truncated = dict(lm.truncated)
            levanters_own = LevanterHarnessLM(lm.leader).loglikelihood(requests[:4])
    except (ImportError, AttributeError, TypeError) as e:
        pytest.fail(f"levanter.eval_harness._LmEvalHarnessWorker / LevanterHarnessLM changed: {e}")
    for (ours, greedy), (expected, expected_greedy) in zip(scored, plain, strict=True):
        assert math.isclose(ours, expected, abs_tol=1e-3) and greedy == expected_greedy
    # Levanter's own tokenization (the text alone, without the document-start token training put before every
    # document) scores other tokens; if this ever holds, the overrides in levanter_harness.py can go.
    assert not any(math.isclose(a, b, abs_tol=1e-3) for (a, _), (b, _) in zip(levanters_own, plain[:4], strict=True))
    assert truncated == {None: 1}  # per task (these requests have none): the long one


def test_asked_for_two_examples_a_task_that_keeps_zero_is_an_error(trained, tmp_path):
    _, _, result = trained
    yaml_path = copy_task("pydocs_next_sentence", tmp_path)
    with open(yaml_path, "a") as f:
        f.write("num_fewshot: 0\n")  # lm-eval keeps a task's own 0 over the one asked for
    model, tokenizer = result.model_and_tokenizer()
    with pytest.raises(HarnessEvalError) as caught:
        evaluate_harness(str(tmp_path / "out"), result.checkpoint_path(), model, tokenizer, [harness_task(yaml_path)],
                         num_fewshot=2, limit=2, vocab_size=result.vocab_size)
    assert ("task 'pydocs_next_sentence' ran 0-shot (lm-eval's n-shot; its config says num_fewshot=0) but 2-shot"
            " was asked") in str(caught.value)
    assert not (tmp_path / "out" / RESULTS_FILE).exists()


def test_identity_is_the_task_files_content_not_their_place(trained, tmp_path):
    pipeline, prefix, _ = trained
    yaml_path = copy_task("pydocs_last_word", tmp_path / "a")

    def step():
        return harness_eval_step("evals/h-harness-ll", pipeline["train"], [yaml_path], num_fewshot=1)

    first = step()
    assert first.hash == harness_eval_step("evals/h-harness-ll", pipeline["train"], shipped_tasks()[1:],
                                           num_fewshot=1).hash  # the shipped files, copied elsewhere: same task
    data = tmp_path / "a" / "pydocs_last_word" / "test.jsonl"
    original = data.read_text()
    data.write_text(original.replace('"word": "tags"', '"word": "tag"', 1))
    changed = step()
    assert changed.hash != first.hash  # one row edited: another output
    with pytest.raises(HarnessTaskError, match="test.jsonl changed since the step was defined"):
        materialize_step(first, prefix=prefix)  # defined before the edit: refuses to run on other data
    data.write_text(original)
    assert step().hash == first.hash
    yaml_file = tmp_path / "a" / "pydocs_last_word" / "pydocs_last_word.yaml"
    yaml_file.write_text(yaml_file.read_text().replace('doc_to_text: "{{context}}"', 'doc_to_text: "{{context}}:"'))
    assert step().hash != first.hash  # and so is the YAML
    assert harness_eval_step("evals/h-harness-ll", pipeline["train"], [yaml_path], num_fewshot=2).hash != first.hash


@pytest.mark.parametrize("case, edit, message", [
    ("missing data file", lambda d: (d / "test.jsonl").unlink(),
     "data file 'test.jsonl' (split 'test') not found at {folder}/test.jsonl (data files are relative to the YAML's"
     " folder)"),
    ("bad YAML", lambda d: (d / "pydocs_next_sentence.yaml").write_text("task: x\ndoc_to_text: [unclosed\n"),
     "pydocs_next_sentence.yaml is not valid YAML (expected ',' or ']', but got '<stream end>' at line 3, column 1)"),
    ("malformed row", lambda d: (d / "fewshot.jsonl").write_text('{"context": "a"}\n{"context": oops}\n'),
     "data file fewshot.jsonl, line 2: malformed JSON (Expecting value: line 1 column 13 (char 12))"),
    ("a row that is not an object", lambda d: (d / "test.jsonl").write_text('{"a": 1}\n[1, 2]\n'),
     "data file test.jsonl, line 2: a JSON list, not an object"),
    ("rolling loglikelihood task", lambda d: (d / "pydocs_next_sentence.yaml").write_text(
        (d / "pydocs_next_sentence.yaml").read_text().replace("output_type: multiple_choice",
                                                               "output_type: loglikelihood_rolling")),
     "output_type 'loglikelihood_rolling' is not scored here (only multiple_choice, loglikelihood, generate_until"),
    ("no data files", lambda d: (d / "pydocs_next_sentence.yaml").write_text("task: x\noutput_type: loglikelihood\n"
                                                                             "dataset_path: allenai/ai2_arc\n"),
     "no local data files (dataset_kwargs.data_files)"),
])
def test_a_malformed_task_is_a_clear_error_naming_its_file(trained, tmp_path, case, edit, message):
    yaml_path = copy_task("pydocs_next_sentence", tmp_path)
    edit(tmp_path / "pydocs_next_sentence")
    expected = f"harness task {yaml_path}: " + message.format(folder=tmp_path / "pydocs_next_sentence")
    with pytest.raises(HarnessTaskError) as caught:
        harness_task(yaml_path)
    assert str(caught.value).startswith(expected), str(caught.value)
    with pytest.raises(StepDefinitionError) as defined:  # where the experiment is written, naming the step too
        harness_eval_step("evals/bad", trained[0]["train"], [yaml_path])
    assert str(defined.value).startswith(f"step 'evals/bad': {expected}")


def test_the_result_shows_as_a_table_one_row_per_task(evaluated):
    from marin_assets.dagster.metadata import result_metadata

    _, outcome = evaluated
    metadata = result_metadata(outcome.record.result)
    table = metadata["result.tasks"]
    assert isinstance(table, dg.TableMetadataValue)
    rows = {r.data["name"]: r.data for r in table.records}
    assert set(rows) == {"pydocs_next_sentence", "pydocs_last_word"}
    columns = {c.name: c.type for c in table.schema.columns}
    assert all(columns[c] == "float" for c in ("acc", "acc_stderr", "acc_norm", "acc_norm_stderr", "perplexity"))
    tasks = outcome.record.result["tasks"]
    assert all(rows[n]["acc"] == tasks[n]["acc"] and rows[n]["acc_stderr"] == tasks[n]["acc_stderr"] for n in rows)
    assert rows["pydocs_next_sentence"]["acc_norm"] == tasks["pydocs_next_sentence"]["acc_norm"]
    assert rows["pydocs_last_word"]["samples"] == LIMIT and rows["pydocs_last_word"]["num_fewshot"] == 2
    # beside each score, its overlap with the model's training data (the tiny stories): none, and said so
    assert columns["contamination"] == "float" and columns["contaminated"] == "bool"
    assert all(rows[n]["contamination"] == 0.0 and rows[n]["contaminated"] is False for n in rows)
    contamination = outcome.record.result["contamination"]
    assert contamination["model"] == "checkpoints/h-llama" and contamination["datasets"] == ["raw/h"]
    assert {n: t["examples"] for n, t in contamination["tasks"].items()} == {n: LIMIT for n in rows}  # those scored
    assert metadata["result.contamination_status"].startswith(
        f"clean: none of the {2 * LIMIT} scored documents of 2 tasks shares a 15-gram with the training data (raw/h)")
    check = {c.name: c for c in evaluated[0].checks}["every_task_scored"]
    assert check.fn(outcome.output_path, outcome.record.result).passed
    assert not check.fn(outcome.output_path, {"tasks": {"pydocs_next_sentence": {"acc": None}}}).passed


def test_a_score_on_documents_the_model_was_trained_on_is_marked_contaminated(trained, tmp_path):
    """A task whose documents are, for some, sentences of the training stories and, for the others, the shipped
    task's documentation sentences: its score carries exactly the planted share, found through the lineage."""
    from marin_assets.dagster.metadata import result_metadata
    from marin_assets.pipeline.data.readers import iter_documents
    from marin_assets.pipeline.data.text_files import expand_files

    pipeline, prefix, _ = trained
    stories = [text for _, _, text in iter_documents(expand_files(pipeline["corpus"].output_path, ["train/*"]))]
    planted = [" ".join(text.split()[:20]) for text in stories[5:8]]
    with open(SHIPPED_TASKS_DIR / "pydocs_last_word" / "test.jsonl") as f:
        clean = [json.loads(line) for line in f][:5]
    yaml_path = copy_task("pydocs_last_word", tmp_path)
    rows = [{"context": t.rsplit(" ", 1)[0], "word": t.rsplit(" ", 1)[1]} for t in planted] + clean
    order = [1, 5, 0, 6, 7, 2, 3, 4]  # the planted rows (0, 1, 2) among the others
    expected = [doc_id for doc_id, row in enumerate(order) if row < len(planted)]
    with open(tmp_path / "pydocs_last_word" / "test.jsonl", "w") as f:
        f.writelines(json.dumps(rows[i]) + "\n" for i in order)
    step = harness_eval_step("evals/h-harness-planted", pipeline["train"], [yaml_path])
    outcome = materialize_step(step, prefix=prefix)
    scored = load_result(step, HarnessResult)
    task = scored.tasks["pydocs_last_word"]
    assert task.samples == len(rows) and task.contamination == 3 / len(rows) and task.contaminated is True
    found = scored.contamination.tasks["pydocs_last_word"]
    assert found.ids == expected and found.per_dataset == {"raw/h": 3 / len(rows)}
    assert {h.example for h in found.hits} <= set(map(str, expected)) and all(h.train == "raw/h" for h in found.hits)
    assert scored.contamination_status.startswith("CONTAMINATED: pydocs_last_word 3/8 (37.5%) of the scored"
                                                  " documents share a 15-gram with the training data (raw/h)")
    table = result_metadata(outcome.record.result)["result.tasks"]
    assert [r.data["contaminated"] for r in table.records] == [True]
    assert step.eval_kind.summary_columns(outcome.record.result)["pydocs_last_word/contamination"] == 3 / len(rows)


def test_every_checkpoint_is_a_partition_with_a_table_of_all(trained, local_ray, dagster_home):
    from marin_assets.dagster import checkpoint_evals_asset, checkpoint_sensor
    from marin_assets.dagster.checkpoint_evals import partitions_of
    from resources import StorageResource

    pipeline, prefix, _ = trained
    harness = harness_checkpoint_evals("evals/h-harness-checkpoints", pipeline["train"], shipped_tasks(),
                                     num_fewshot=1, limit=4)
    losses = loss_checkpoint_evals("evals/h-checkpoints", pipeline["train"], {"stories": pipeline["tokenized"]},
                             max_eval_batches=1)
    sensor = checkpoint_sensor([losses, harness])
    storage = StorageResource(prefix=prefix)
    defs = build_definitions([], resources={"storage": storage},
                             extra_assets=[checkpoint_evals_asset(harness), checkpoint_evals_asset(losses)],
                             sensors=[sensor])
    instance = dg.DagsterInstance.get()
    with dg.build_sensor_context(instance=instance, definitions=defs, resources={"storage": storage}) as context:
        ticked = sensor(context)
    # one run per checkpoint evaluates both families, which share the training run's partitions
    assert [(r.partition_key, sorted(k.to_user_string() for k in r.asset_selection)) for r in ticked.run_requests] == [
        (str(s), ["evals/h-checkpoints", "evals/h-harness-checkpoints"]) for s in (5, 10, 11)]
    assert partitions_of(harness) == partitions_of(losses)
    for request in ticked.dynamic_partitions_requests:
        instance.add_dynamic_partitions(request.partitions_def_name, list(request.partition_keys))

    job = defs.resolve_implicit_global_asset_job_def()
    for checkpoint in ("5", "11"):
        run = job.execute_in_process(instance=instance, partition_key=checkpoint,
                                     asset_selection=[dg.AssetKey(["evals", "h-harness-checkpoints"])])
        assert run.success
    events = instance.fetch_materializations(dg.AssetKey(["evals", "h-harness-checkpoints"]), limit=10).records
    by_step = {int(e.partition_key): e.asset_materialization.metadata for e in events}
    assert sorted(by_step) == [5, 11]
    assert by_step[11]["checkpoint_step"].value == 11
    assert 0 <= by_step[11]["pydocs_next_sentence/acc"].value <= 1
    assert "pydocs_last_word/perplexity" in by_step[11] and "pydocs_next_sentence/acc_stderr" not in by_step[11]
    table = by_step[11]["all_checkpoints"]
    assert [r.data["step"] for r in table.records] == [5, 11]  # 10 is a partition not evaluated yet
    assert [c.name for c in table.schema.columns] == [
        "step", "pydocs_next_sentence/acc", "pydocs_next_sentence/acc_stderr", "pydocs_next_sentence/acc_norm",
        "pydocs_next_sentence/acc_norm_stderr", "pydocs_last_word/acc", "pydocs_last_word/acc_stderr",
        "pydocs_last_word/perplexity"]
    step_11 = load_result(harness.step(11), HarnessResult)
    assert table.records[1].data["pydocs_next_sentence/acc"] == step_11.tasks["pydocs_next_sentence"].acc
    assert step_11.step == 11 and step_11.tasks["pydocs_last_word"].samples == 4
