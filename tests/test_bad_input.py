"""Bad input, case by case: each gets a clear error naming the asset and the cause, leaves no
SUCCESS and no record, and does not touch a neighbouring output. docs/bad-input.md lists the
same cases with the same messages (the last test holds the two together)."""

import gzip
import hashlib
import io
import json
import os
import re
import subprocess
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from marin_assets import Resources, Step, StepDefinitionError, materialize_step
from marin_assets.core.decision import Action, decide
from marin_assets.core.record import RecordNotAvailableError, read_record
from marin_assets.core.status import Status
from marin_assets.core.step import walk
from marin_assets.core.stores import read_status
from marin_assets.pipeline.data.download import hf_download_step, url_download_step
from marin_assets.pipeline.hello import numbers_step
from marin_assets.pipeline.tokens.chat import chat_tokenize_step
from marin_assets.pipeline.tokens.tokenize import tokenize_step
from marin_assets.pipeline.tokens.tokenizer import bpe_tokenizer_step, existing_tokenizer_step
from marin_assets.pipeline.training.pretrain.step import train_step
from marin_assets.pipeline.training.specs import ModelSpec, TrainerSpec
from tests.support.helpers import FAST, ROOT, corpus_and_tokenizer, wait_for
from tests.support.hub_server import HubRepo, release_hub, serve_hub, use_hub

DOCS = ROOT / "docs" / "bad-input.md"


@dataclass(frozen=True)
class Case:
    title: str
    """The row's first column in docs/bad-input.md."""
    error: str
    """A regular expression the error (with its notes) must match; the docs row quotes it."""


CASES = {
    "malformed_json": Case("a malformed JSON line", r"a\.jsonl, line 2: malformed JSON"),
    "missing_text": Case("a document without the text field", r"a\.jsonl, line 1: no 'text' field"),
    "empty_dataset": Case("an empty dataset", r"split 'train' of .* has no documents"),
    "not_an_object": Case("a JSON line that is not an object", r"a\.jsonl, line 2: a JSON array, not an object"),
    "null_text": Case("a text field that is not text", r"a\.jsonl, line 1: 'text' is null, not text"),
    "invalid_utf8": Case("invalid UTF-8 in a JSON line", r"a\.jsonl, line 1: invalid UTF-8 at byte 12 of the line"),
    "truncated_gzip": Case("a truncated compressed file",
                           r"a\.jsonl\.gz, line \d+: corrupt or truncated gzip data; lines 1-\d+ were read"),
    "not_parquet": Case("a file that is not parquet", r"a\.parquet: not a readable parquet file"),
    "no_text_column": Case("a parquet file without the text column",
                           r"a\.parquet: no 'text' column \(columns: id, body\)"),
    "plain_txt": Case("a .txt file with no text_format chosen",
                      r"a\.txt: plain text; choose text_format='text-file' \(one document per file\) or 'text-lines'"),
    "unknown_revision": Case("an unknown Hugging Face revision", r"revision 'no-such-branch' not found"),
    "unreachable_url": Case("an unreachable URL", r"http://127\.0\.0\.1:9/data\.jsonl: unreachable"),
    "missing_path": Case("a local path that does not exist", r"no-such-folder: not found"),
    "broken_tokenizer": Case("a tokenizer folder that does not load",
                             r"tokenizer '.*broken-tokenizer' does not load: its files lack the key 'added_tokens'"),
    "empty_tokenizer": Case("a tokenizer folder with no tokenizer files",
                            r"tokenizer '.*empty-tokenizer' does not load: the folder holds no tokenizer files"
                            r" \(tokenizer\.json, tokenizer_config\.json, vocab\.json, …; it contains: nothing\)"),
    "vocab_too_small": Case("a vocabulary too small for byte-level BPE", r"vocab_size 10 is too small"),
    "negative_steps": Case("a negative number of training steps", r"num_train_steps must be positive, got -5"),
    "zero_batch": Case("a zero batch size", r"train_batch_size must be positive, got 0"),
    "seq_too_long": Case("a sequence longer than the model allows",
                         r"seq_len 8192 is longer than the model allows \(max_seq_len 2048\)"),
    "negative_weight": Case("a negative mixture weight", r"mixture weights must be non-negative"),
    "zero_weights": Case("mixture weights all zero", r"mixture weights are all zero"),
    "mixed_tokenizers": Case("a mixture mixing tokenizers", r"the mixture mixes tokenizers"),
    "less_than_a_batch": Case("training data smaller than one batch",
                              r"component 'tiny' has \d+ train tokens in 3 documents, less than one batch"
                              r" \(16 sequences × 128 tokens = 2,048 tokens\)"),
    "unhashable_attr": Case("a hash_attr with no stable encoding", r"step 'raw/x': hash_attrs\['fn'\] is a callable"),
    "dotdot_name": Case("a step name with '..'", r"invalid step name 'raw/\.\./x': it contains '\.\.'"),
    "absolute_name": Case("an absolute step name", r"invalid step name '/raw/x': it starts with '/'"),
    "duplicate_name": Case("two different steps with one name", r"two different steps are named 'raw/twin'"),
    "escaping_override": Case("an override escaping the prefix",
                              r"override_output_path '\.\./elsewhere' must stay under the prefix"),
    "placeless_override": Case("an override that names no place",
                               r"override_output_path 'gs://' is a bare 'gs://' that names no bucket or folder"),
    "merged_names": Case("two names Dagster would make one",
                         r"steps 'data/a-b' and 'data/a_b' would both be the Dagster op name 'data__a_b'"),
    "sweep_duplicate": Case("a sweep grid point given twice",
                            r"sweep 's': the grid point model 'small' × learning rate 0\.001 is also model 'small'"),
    "sweep_collision": Case("sweep points with one run name",
                            r"learning rate 0\.0010000001 and model 'small' × learning rate 0\.001 both get the run"
                            r" name 's-small-lr0\.001'"),
    "infeasible_resources": Case("a resource request the cluster cannot satisfy",
                                 r"needs \{CPU=64\} on one node, which this cluster can never provide"),
    "disk_full": Case("a full disk during a write", r"No space left on device"),
    "not_normalized": Case("a curation stage given a dataset that is not normalized",
                           r"exact_dedup: .*raw/jsonl_\w+ holds no normalized shards"
                           r" \(\{split\}/part-00000\.parquet\)"),
    "corrupt_shard": Case("a curated shard that is not parquet",
                          r"fuzzy_dedup: shard .*train/part-00000\.parquet is unreadable"),
    "everything_removed": Case("a curation stage that would remove every document",
                               r"normalize: removed every one of 3 documents \(empty: 3\); nothing is written as a"
                               r" success"),
    "eval_set_field": Case("an evaluation set record without the text field",
                           r"decontaminate: evaluation set 'broken': .*bad\.jsonl, line 2: no 'text' field"
                           r" \(fields: 'question'\)"),
    "chat_no_conversation": Case("a chat record without a conversation",
                                 r"a\.jsonl, line 1: no 'messages' \(OpenAI\) or 'conversations' \(ShareGPT\)"
                                 r" conversation \(fields: 'text'\)"),
    "chat_not_a_list": Case("chat turns that are not a list",
                            r"a\.jsonl, line 1: 'messages' is a string, not a list of turns"),
    "chat_unknown_role": Case("a chat turn with an unknown role",
                              r"a\.jsonl, line 1: turn 2 has role 'bot', not one of 'system', 'user', 'assistant'"),
    "chat_empty_turn": Case("an empty chat turn", r"a\.jsonl, line 2: turn 1 \(user\) is empty"),
    "chat_no_assistant": Case("a conversation without an assistant turn",
                              r"a\.jsonl, line 1: no assistant turn \(roles: system, user\); SFT learns only from"
                              r" assistant turns"),
    "chat_turn_not_text": Case("a chat turn whose text is not text",
                               r"a\.parquet, row 3: turn 2 \(gpt\) has 'value' null, not text"),
}


def text_of(error: BaseException) -> str:
    return "".join(traceback.format_exception(error))


def snapshot(path: str) -> dict[str, str]:
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(Path(path).rglob("*")) if p.is_file()}


@pytest.fixture
def neighbour(prefix):
    """A finished output beside the failing one: it must come through unchanged."""
    step = numbers_step("hello/neighbour", n=50, seed=4)
    out = materialize_step(step, prefix=prefix, settings=FAST).output_path
    before = snapshot(out)
    yield
    assert snapshot(out) == before and read_status(out).status is Status.SUCCESS


def fails_at_materialize(case: str, steps: list[Step], prefix: str, failing: Step | None = None,
                         status_after: tuple[Status, ...] = (Status.FAILED,), **kwargs) -> str:
    """Materialize `steps` in order; the last (or `failing`) must fail with the case's error,
    naming the asset, with FAILED and no record."""
    failing = failing or steps[-1]
    with pytest.raises(Exception) as caught:
        for step in steps:
            materialize_step(step, prefix=prefix, settings=FAST, **kwargs)
    text = text_of(caught.value)
    assert re.search(CASES[case].error, text), text[-2000:]
    assert f"step {failing.name!r}" in text  # the note names the asset
    out = failing.output_path_under(prefix)
    assert read_status(out).status in status_after
    with pytest.raises(RecordNotAvailableError):
        read_record(out)
    return text


def fails_at_definition(case: str, define: Callable[[], object], error=(StepDefinitionError, ValueError)) -> str:
    with pytest.raises(error) as caught:
        define()
    text = text_of(caught.value)
    assert re.search(CASES[case].error, text), text[-2000:]
    return text


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("tok")
    return corpus_and_tokenizer(root, train_documents=300, validation_documents=20, seed=3, shards=1)[1]


def folder(tmp_path: Path, files: dict[str, str | bytes]) -> str:
    root = tmp_path / "data"
    root.mkdir(exist_ok=True)
    for name, content in files.items():
        (root / name).write_bytes(content if isinstance(content, bytes) else content.encode())
    return str(root)


def tokenize_folder(tmp_path, tokenizer_dir, files, name, pattern="*.jsonl"):
    data = url_download_step(f"raw/{name}", [folder(tmp_path, files)])
    tok = existing_tokenizer_step("tokenizers/good", tokenizer_dir)
    return [data, tok, tokenize_step(f"tokenized/{name}", data, tok, splits={"train": [pattern]})]


def test_malformed_json_line(tmp_path, prefix, neighbour, tokenizer_dir):
    steps = tokenize_folder(tmp_path, tokenizer_dir, {"a.jsonl": '{"text": "ok"}\n{not json\n'}, "bad-json")
    fails_at_materialize("malformed_json", steps, prefix)


def test_missing_text_field(tmp_path, prefix, neighbour, tokenizer_dir):
    steps = tokenize_folder(tmp_path, tokenizer_dir, {"a.jsonl": '{"body": "x"}\n'}, "no-text")
    fails_at_materialize("missing_text", steps, prefix)


def test_empty_dataset(tmp_path, prefix, neighbour, tokenizer_dir):
    steps = tokenize_folder(tmp_path, tokenizer_dir, {"a.jsonl": ""}, "empty")
    fails_at_materialize("empty_dataset", steps, prefix)


def truncated_gzip() -> bytes:
    lines = "".join(json.dumps({"text": f"document {i}"}) + "\n" for i in range(20_000))
    return gzip.compress(lines.encode())[:-1000]


def parquet_bytes(**columns) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    sink = io.BytesIO()
    pq.write_table(pa.table(columns), sink)
    return sink.getvalue()


@pytest.mark.parametrize("case, file, content", [
    ("not_an_object", "a.jsonl", '{"text": "ok"}\n[1, 2]\n'),
    ("null_text", "a.jsonl", '{"text": null}\n'),
    ("invalid_utf8", "a.jsonl", b'{"text": "b\xffd"}\n'),
    ("truncated_gzip", "a.jsonl.gz", truncated_gzip()),
    ("not_parquet", "a.parquet", "id,text\n1,hello\n"),
    ("no_text_column", "a.parquet", parquet_bytes(id=[1], body=["x"])),
    ("plain_txt", "a.txt", "hello\n"),
])
def test_unreadable_documents(tmp_path, prefix, neighbour, tokenizer_dir, case, file, content):
    steps = tokenize_folder(tmp_path, tokenizer_dir, {file: content}, case.replace("_", "-"), pattern=file)
    fails_at_materialize(case, steps, prefix)


QUESTION = {"role": "user", "content": "What is a list?"}
ANSWER = {"role": "assistant", "content": "A mutable sequence."}


def chat_lines(*conversations) -> str:
    return "".join(json.dumps(c) + "\n" for c in conversations)


def sharegpt_parquet(*second_answers) -> bytes:
    """ShareGPT conversations as parquet, one per given second turn's value."""
    return parquet_bytes(conversations=[[{"from": "human", "value": "What is a list?"}, {"from": "gpt", "value": v}]
                                        for v in second_answers])


@pytest.mark.parametrize("case, file, content", [
    ("chat_no_conversation", "a.jsonl", chat_lines({"text": "hi"})),
    ("chat_not_a_list", "a.jsonl", chat_lines({"messages": "user: hi"})),
    ("chat_unknown_role", "a.jsonl", chat_lines({"messages": [QUESTION, {"role": "bot", "content": "hi"}]})),
    ("chat_empty_turn", "a.jsonl", chat_lines({"messages": [QUESTION, ANSWER]},
                                              {"messages": [{"role": "user", "content": " \n"}, ANSWER]})),
    ("chat_no_assistant", "a.jsonl", chat_lines({"messages": [{"role": "system", "content": "Be brief."}, QUESTION]})),
    ("chat_turn_not_text", "a.parquet", sharegpt_parquet("A mutable sequence.", "An ordered one.", None)),
])
def test_malformed_conversations(tmp_path, prefix, neighbour, tokenizer_dir, case, file, content):
    data = url_download_step(f"raw/{case}", [folder(tmp_path, {file: content})])
    tok = existing_tokenizer_step("tokenizers/good", tokenizer_dir)
    chat = chat_tokenize_step(f"tokenized/{case}", data, tok, splits={"train": [file]})
    fails_at_materialize(case, [data, tok, chat], prefix)


def test_unknown_hugging_face_revision(prefix, neighbour, monkeypatch):
    with serve_hub(HubRepo("user/data", {"a.txt": "x"})) as server:
        use_hub(monkeypatch, server.url)
        try:
            fails_at_materialize("unknown_revision", [hf_download_step("raw/hf", "user/data", "no-such-branch")],
                                 prefix)
        finally:
            release_hub()


def test_unreachable_url(prefix, neighbour):
    fails_at_materialize("unreachable_url", [url_download_step("raw/web", ["http://127.0.0.1:9/data.jsonl"])],
                         prefix)


def test_nonexistent_local_path(tmp_path, prefix, neighbour):
    fails_at_materialize("missing_path", [url_download_step("raw/local", [str(tmp_path / "no-such-folder")])],
                         prefix)


def test_tokenizer_folder_that_does_not_load(tmp_path, prefix, neighbour):
    broken = tmp_path / "broken-tokenizer"
    broken.mkdir()
    (broken / "tokenizer.json").write_text('{"this is": "not a tokenizer"}')
    fails_at_materialize("broken_tokenizer", [existing_tokenizer_step("tokenizers/broken", str(broken))], prefix)


def test_tokenizer_folder_with_no_tokenizer_files(tmp_path, prefix, neighbour):
    empty = tmp_path / "empty-tokenizer"
    empty.mkdir()
    text = fails_at_materialize("empty_tokenizer", [existing_tokenizer_step("tokenizers/empty", str(empty))], prefix)
    assert "AttributeError" not in text


def test_vocabulary_too_small(tmp_path, prefix, neighbour):
    data = url_download_step("raw/small", [folder(tmp_path, {"a.jsonl": '{"text": "hello"}\n'})])
    fails_at_materialize("vocab_too_small", [data, bpe_tokenizer_step("tokenizers/tiny", data, vocab_size=10,
                                                                      files=["*.jsonl"])], prefix)


@pytest.mark.parametrize("case, spec", [
    ("negative_steps", lambda: TrainerSpec(num_train_steps=-5)),
    ("zero_batch", lambda: TrainerSpec(train_batch_size=0)),
    ("seq_too_long", lambda: ModelSpec(seq_len=8192)),
])
def test_invalid_hyperparameters_fail_where_they_are_written(case, spec):
    fails_at_definition(case, spec)


def tokenized(name: str, tokenizer_name: str = "tokenizers/t") -> Step:
    corpus = numbers_step(f"raw/{name}", n=1)
    tok = existing_tokenizer_step(tokenizer_name, "gpt2")
    return tokenize_step(f"tokenized/{name}", corpus, tok)


@pytest.mark.parametrize("case, weights", [("negative_weight", {"a": 1.0, "b": -0.5}),
                                           ("zero_weights", {"a": 0.0, "b": 0.0})])
def test_bad_mixture_weights(case, weights):
    text = fails_at_definition(case, lambda: train_step("checkpoints/mix", {"a": tokenized("a"), "b": tokenized("b")},
                                                        weights=weights))
    assert "'checkpoints/mix'" in text


def test_a_mixture_mixing_tokenizers():
    text = fails_at_definition("mixed_tokenizers", lambda: train_step(
        "checkpoints/mixed", {"a": tokenized("a", "tokenizers/one"), "b": tokenized("b", "tokenizers/two")}))
    assert "'checkpoints/mixed'" in text


def test_training_data_smaller_than_one_batch_fails_before_any_compute(tmp_path, prefix, neighbour, tokenizer_dir):
    texts = "".join(json.dumps({"text": f"a short document number {i}"}) + "\n" for i in range(3))
    data, tok, tokenized_step = tokenize_folder(tmp_path, tokenizer_dir, {"a.jsonl": texts}, "tiny")
    train = train_step("checkpoints/tiny", {"tiny": tokenized_step}, ModelSpec(hidden_dim=32, intermediate_dim=64,
                       num_layers=1, num_heads=2, num_kv_heads=2, seq_len=128),
                       trainer=TrainerSpec(num_train_steps=2, train_batch_size=16))
    fails_at_materialize("less_than_a_batch", [data, tok, tokenized_step, train], prefix)
    out = Path(train.output_path_under(prefix))
    assert not (out / "checkpoints").exists() and not (out / "metrics.jsonl").exists(), "Levanter never started"


def test_unencodable_hash_attrs_bad_names_duplicates_and_escaping_overrides():
    fails_at_definition("unhashable_attr", lambda: Step(name="raw/x", fn=print, hash_attrs={"fn": lambda: 1}))
    fails_at_definition("dotdot_name", lambda: Step(name="raw/../x", fn=print))
    fails_at_definition("absolute_name", lambda: Step(name="/raw/x", fn=print))
    twin_a, twin_b = Step(name="raw/twin", fn=print, hash_attrs={"v": 1}), Step(name="raw/twin", fn=print)
    fails_at_definition("duplicate_name", lambda: walk([twin_a, twin_b]))
    fails_at_definition("escaping_override", lambda: Step(name="raw/x", fn=print, override_output_path="../elsewhere"))


def test_placeless_overrides_merged_names_and_sweep_points():
    from marin_assets import build_definitions
    from marin_assets.pipeline.hello import stats_step
    from marin_assets.pipeline.sweeps import lr_model_sweep

    fails_at_definition("placeless_override", lambda: Step(name="raw/x", fn=print, override_output_path="gs://"))
    fails_at_definition("merged_names", lambda: build_definitions([Step(name="data/a-b", fn=print),
                                                                   Step(name="data/a_b", fn=print)]))
    small = ModelSpec(hidden_dim=32, intermediate_dim=64, num_heads=2, num_kv_heads=2)
    data = {"n": stats_step("tokenized/n", numbers_step("raw/n", n=5))}
    fails_at_definition("sweep_duplicate", lambda: lr_model_sweep("s", data, {"small": small}, [1e-3, 1e-3]))
    fails_at_definition("sweep_collision", lambda: lr_model_sweep("s", data, {"small": small}, [1e-3, 1.0000001e-3]))


def test_a_resource_request_the_cluster_cannot_satisfy(prefix, neighbour, local_ray):
    from marin_assets.execution.ray_runner import ray_runner
    from resources import RayResource

    step = Step(name="train/huge", fn=print, resources=Resources(cpu=64))
    fails_at_materialize("infeasible_resources", [step], prefix,
                         run_fn=ray_runner(RayResource(), __import__("logging").getLogger("test")))


def write_megabytes(n: int, output_path: str) -> str:
    os.makedirs(output_path, exist_ok=True)
    with open(os.path.join(output_path, "big.bin"), "wb") as f:
        f.write(os.urandom(n * 2**20))
    return "written"


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MiB tmpfs (root mounts it; the suite runs as root here and in CI)."""
    mount = tmp_path / "small-disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], check=True)
    try:
        yield str(mount)
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def test_a_full_disk_during_a_write(small_disk):
    import functools

    prefix = small_disk
    neighbour_step = numbers_step("hello/neighbour", n=20, seed=4)
    neighbour_out = materialize_step(neighbour_step, prefix=prefix, settings=FAST).output_path
    before = snapshot(neighbour_out)
    big = Step(name="raw/big", fn=functools.partial(write_megabytes, 4), hash_attrs={"mb": 4})
    fails_at_materialize("disk_full", [big], prefix, status_after=(Status.FAILED, Status.RUNNING))
    assert snapshot(neighbour_out) == before and read_status(neighbour_out).status is Status.SUCCESS
    # A full disk may not even take the FAILED mark: the lease then goes stale and the next
    # materialization, with room to write, takes it over.
    wait_for(lambda: decide(read_status(big.output_path_under(prefix)), FAST.stale_timeout).action is Action.RUN,
             "the failed attempt's status to be FAILED or its lease stale", interval=0.05)
    os.remove(os.path.join(big.output_path_under(prefix), "big.bin"))  # the operator frees space
    fits = Step(name="raw/big", fn=functools.partial(write_megabytes, 1), hash_attrs={"mb": 4})
    outcome = materialize_step(fits, prefix=prefix, settings=FAST)
    assert not outcome.cached and outcome.took_over and read_status(outcome.output_path).status is Status.SUCCESS


def test_the_docs_table_lists_every_case_with_its_error():
    table = []
    for line in DOCS.read_text().splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]  # '\|' is a literal pipe
        if len(cells) >= 3 and cells[0] not in ("input", "---"):
            table.append(cells)
    rows = {cells[0]: cells for cells in table}
    assert len(rows) == len(table), "a case is listed twice"
    assert sorted(rows) == sorted(c.title for c in CASES.values())
    for case in CASES.values():
        message = rows[case.title][-1].strip("`").replace("\\|", "|")
        assert re.search(case.error, message), (case.title, message)
    assert len(CASES) >= 15
    # Each row parsed into its three plain-text cells: an unescaped '|' in a message would split it, and
    # every row says where the case is caught and quotes the error with its class in one code span.
    for title, cells in rows.items():
        assert len(cells) == 3, (title, cells)
        assert re.fullmatch(r"(materializing|definition)\b.*", cells[1]), (title, cells[1])
        assert re.fullmatch(r"`[A-Z]\w*Error: [^`]+`", cells[2]), (title, cells[2])


def write_jsonl(records: list[dict], file: str, output_path: str) -> None:
    """A raw dataset step's function: `records` as JSON lines at `file` under the output."""
    path = Path(output_path) / file
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_curation_stages_name_the_stage_the_file_and_the_row(prefix):
    import functools

    from marin_assets.pipeline.curation.decontaminate import EvalSet, decontaminate_step
    from marin_assets.pipeline.curation.exact_dedup import exact_dedup_step
    from marin_assets.pipeline.curation.fuzzy_dedup import fuzzy_dedup_step
    from marin_assets.pipeline.curation.normalize import normalize_step

    texts = [{"text": f"document number {i} about the standard library"} for i in range(4)]
    raw = Step(name="raw/jsonl", fn=functools.partial(write_jsonl, texts, "train/a.jsonl"), hash_attrs={"n": 4})
    fails_at_materialize("not_normalized", [raw, exact_dedup_step("curated/dedup", raw)], prefix)

    normalized = normalize_step("curated/normalized", raw)
    materialize_step(normalized, prefix=prefix, settings=FAST)
    neighbour = snapshot(normalized.output_path_under(prefix))
    shard = Path(normalized.output_path_under(prefix)) / "train" / "part-00000.parquet"
    corrupted = Step(name="curated/corrupted", override_output_path=str(Path(prefix) / "corrupted"),
                     fn=lambda out: (Path(out, "train").mkdir(parents=True, exist_ok=True),
                                     Path(out, "train", shard.name).write_bytes(shard.read_bytes()[:40])))
    fails_at_materialize("corrupt_shard", [corrupted, fuzzy_dedup_step("curated/fuzzy", corrupted)], prefix)

    blank = Step(name="raw/blank", fn=functools.partial(write_jsonl, [{"text": " "}, {"text": ""}, {"text": "\n"}],
                                                        "train/a.jsonl"), hash_attrs={"blank": True})
    fails_at_materialize("everything_removed", [blank, normalize_step("curated/blank", blank)], prefix)

    questions = Step(name="raw/questions", hash_attrs={"v": 1}, fn=functools.partial(
        write_jsonl, [{"text": "a fine record of an evaluation set"}, {"question": "no text here"}], "bad.jsonl"))
    decon = decontaminate_step("curated/decon", normalized, [EvalSet("broken", questions, ("bad.jsonl",))])
    fails_at_materialize("eval_set_field", [questions, decon], prefix)
    assert snapshot(normalized.output_path_under(prefix)) == neighbour, "the input stage's output is untouched"
