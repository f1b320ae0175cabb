"""A Hugging Face model from the Hub at a pinned commit: its config, tokenizer and safetensors weights, as a
folder that `from_hf(step)` starts a run from and evaluation reads, and that `hf_to_levanter_step` converts.

The revision is resolved to its commit before anything is copied, and the record names that commit: a
branch is followed like any Hub download (the source sensor sees it move, `data/download.py`), a commit sha
never changes. The repository is checked first — a `config.json`, safetensors weights — so a repository
that is not a model fails before gigabytes are copied. Downloads are resumable and checked as in
`download_hf` (sizes and LFS sha256 or git blob ids); `HF_ENDPOINT` and `HF_TOKEN` come from the
environment and never enter the record.
"""

from __future__ import annotations

import fnmatch
import json
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import fsspec

from marin_assets.core.checks import Check, CheckOutcome
from marin_assets.core.record_types import record_type
from marin_assets.core.step import Step, StepDefinitionError, made_by
from marin_assets.pipeline.data.download import (
    FILES_MATCH_RECORD,
    DownloadedFile,
    DownloadError,
    download_hf,
    hf_source_version,
    is_commit_sha,
)
from marin_assets.pipeline.tokens.tokenizer import TOKENIZER_FILES
from marin_assets.pipeline.training.specs import ModelSpec, SpecError

MODEL_FILES = ("config.json", "generation_config.json", "model*.safetensors", "model.safetensors.index.json",
               *TOKENIZER_FILES, "special_tokens_map.json", "added_tokens.json", "chat_template.jinja",
               "chat_template.json")
"""What a model folder needs for training and evaluation: the config, the safetensors weights (one file or
shards and their index) and the tokenizer. Not `pytorch_model*.bin` (reading it needs torch), nor the
`original/` checkpoints some repositories carry beside."""

SAFETENSORS_DTYPES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
                      "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}
"""Bytes per element of each safetensors dtype (to check a header against its file)."""


class HfModelError(ValueError):
    """A Hugging Face repository or folder is not a model this library can read: no config, no safetensors
    weights, no tokenizer, or a family `ModelSpec` does not describe."""


@record_type("hf_model")
@dataclass(frozen=True)
class HfModel:
    """A Hugging Face model folder copied from the Hub at one commit, and what reading it needs."""

    repo_id: str
    revision: str
    """The revision asked for (a branch, a tag or a commit sha)."""
    commit: str
    """The commit sha it resolved to: exactly what was copied."""
    path: str
    """The model folder (the step's output): `config.json`, weights and tokenizer files."""
    model_type: str | None
    """`config.json`'s `model_type` (`llama`, `gpt2`, `qwen2` …)."""
    architectures: list[str]
    """`config.json`'s `architectures` (`LlamaForCausalLM` …)."""
    vocab_size: int
    """Rows of the model's embedding (`config.json`'s `vocab_size`)."""
    parameters: int
    """Elements of every weight tensor in the safetensors files (tied weights stored once count once)."""
    dtypes: list[str]
    """The safetensors dtypes of the weights (`F32`, `BF16` …)."""
    model: ModelSpec | None
    """The model as a `ModelSpec` (Llama or GPT-2, with `seq_len` its full context); None for another family."""
    model_note: str | None
    """Why `model` is None (the family, or what `ModelSpec` cannot express); None when it is not."""
    tokenizer: str | None
    """The folder again when it holds a tokenizer, else None (give evaluation and training another)."""
    files: list[DownloadedFile]
    """Every file copied, with size and sha256."""
    bytes: int

    def model_and_tokenizer(self) -> tuple[ModelSpec, str]:
        """The model spec and tokenizer folder (what evaluating the folder needs), or why there are none."""
        if self.model is None:
            raise HfModelError(f"{self.repo_id}@{self.commit[:12]}: {self.model_note}")
        if self.tokenizer is None:
            raise HfModelError(f"{self.repo_id}@{self.commit[:12]} has no tokenizer files"
                               f" ({', '.join(TOKENIZER_FILES[:3])} …)")
        return self.model, self.tokenizer

    def checkpoint_path(self, step: int | None = None) -> str:
        """The weights to read: the folder itself (a Hugging Face model has one checkpoint)."""
        if step is not None:
            raise HfModelError(f"{self.repo_id}@{self.commit[:12]} is one Hugging Face checkpoint, not steps;"
                               f" asked for step {step}")
        return self.path


def model_spec_of(config: Mapping[str, Any], seq_len: int | None = None) -> ModelSpec:
    """The `ModelSpec` of a Hugging Face Llama or GPT-2 `config.json`; `HfModelError` for another family or a
    setting `ModelSpec` cannot express (rope scaling, another activation, a head size other than hidden ÷ heads).

    `seq_len`: a Llama's training and evaluation window; None: its whole context (`max_position_embeddings`), as
    Levanter reads a Hugging Face config. GPT-2 learns a weight per position: its window is `n_positions`."""
    family = config.get("model_type")
    try:
        if family == "llama":
            heads = int(config["num_attention_heads"])
            context = int(config.get("max_position_embeddings") or 2048)
            rope = config.get("rope_parameters") or {}
            theta = config.get("rope_theta") if config.get("rope_theta") is not None else rope.get("rope_theta")
            spec = ModelSpec(family="llama", hidden_dim=int(config["hidden_size"]),
                             intermediate_dim=int(config["intermediate_size"]),
                             num_layers=int(config["num_hidden_layers"]), num_heads=heads,
                             num_kv_heads=int(config.get("num_key_value_heads") or heads),
                             seq_len=seq_len or context, max_seq_len=context,
                             norm_epsilon=float(config.get("rms_norm_eps", 1e-6)),
                             rope_theta=float(theta if theta is not None else 10000.0),
                             tie_embeddings=bool(config.get("tie_word_embeddings", False)))
        elif family == "gpt2":
            hidden, context = int(config["n_embd"]), int(config.get("n_positions") or 1024)
            spec = ModelSpec(family="gpt2", hidden_dim=hidden, intermediate_dim=4 * hidden,
                             num_layers=int(config["n_layer"]), num_heads=int(config["n_head"]),
                             num_kv_heads=int(config["n_head"]), seq_len=context, max_seq_len=context,
                             norm_epsilon=float(config.get("layer_norm_epsilon", 1e-5)))
        else:
            raise HfModelError(f"model_type {family!r} is not a family ModelSpec describes (llama, gpt2)")
    except KeyError as e:
        raise HfModelError(f"config.json of a {family} model has no {e.args[0]!r}") from None
    except SpecError as e:
        raise HfModelError(f"config.json does not make a valid {family} ModelSpec: {e}") from None
    problems = spec.hf_differences(config)
    if problems:
        raise HfModelError(f"config.json of this {family} model has settings ModelSpec cannot express: "
                           + "; ".join(problems))
    return spec


def safetensors_summary(folder: str) -> tuple[int, list[str]]:
    """(Elements of every tensor, the dtypes) of the `*.safetensors` files of a model folder, read from each
    file's header (its first bytes): no weight is loaded."""
    fs, root = fsspec.core.url_to_fs(folder)
    names = sorted(p for p in fs.ls(root.rstrip("/"), detail=False) if p.endswith(".safetensors"))
    if not names:
        raise HfModelError(f"{folder} has no *.safetensors weights")
    elements, dtypes = 0, set()
    for name in names:
        with fs.open(name, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(length))
        for key, tensor in header.items():
            if key == "__metadata__":
                continue
            count = 1
            for dim in tensor["shape"]:
                count *= dim
            elements += count
            dtypes.add(tensor["dtype"])
    return elements, sorted(dtypes)


def has_tokenizer(names: Sequence[str]) -> bool:
    """Whether a model folder's file names include a tokenizer transformers can build."""
    return any(n in TOKENIZER_FILES or n.endswith(".tiktoken") for n in names)


def _repo_files(repo_id: str, commit: str) -> list[str]:
    import httpx
    from huggingface_hub import HfApi

    try:
        return list(HfApi().list_repo_files(repo_id, revision=commit, repo_type="model"))
    except (httpx.HTTPError, OSError) as e:
        raise DownloadError(f"model {repo_id}@{commit}: cannot list its files ({type(e).__name__}: {e})") from None


def check_model_repo(repo_id: str, commit: str, files: Sequence[str]) -> None:
    """A model repository's files at `commit` hold what a model folder needs (`HfModelError` saying what is
    missing otherwise): a `config.json` and safetensors weights, at the top of the repository."""
    where = f"model {repo_id}@{commit}"
    shown = ", ".join(sorted(files)[:12]) + (f", … ({len(files)} files)" if len(files) > 12 else "")
    if "config.json" not in files:
        raise HfModelError(f"{where} has no config.json: not a Transformers model repository (its files: {shown})")
    if not any(fnmatch.fnmatch(f, "model*.safetensors") and "/" not in f for f in files):
        torch_only = [f for f in files if f.endswith(".bin") or f.endswith(".pt")]
        why = (f" (only {', '.join(torch_only[:3])}: PyTorch weights, which reading needs torch for; convert them"
               " to safetensors)") if torch_only else f" (its files: {shown})"
        raise HfModelError(f"{where} has no safetensors weights (model*.safetensors){why}")


def download_hf_model(output_path: str, repo_id: str, revision: str = "main",
                      include: Sequence[str] = MODEL_FILES) -> HfModel:
    """Copy a Hugging Face model (config, safetensors weights, tokenizer) at `revision`, resolved to its commit,
    into a model folder; the repository is checked to be a model before any weight is copied."""
    commit = hf_source_version(repo_id, revision, repo_type="model")
    check_model_repo(repo_id, commit, _repo_files(repo_id, commit))
    copied = download_hf(output_path, repo_id, commit, include, repo_type="model")
    fs, root = fsspec.core.url_to_fs(output_path)
    config = json.loads(fs.cat_file(f"{root.rstrip('/')}/config.json"))
    parameters, dtypes = safetensors_summary(output_path)
    try:
        spec, note = model_spec_of(config), None
    except HfModelError as e:
        spec, note = None, str(e)
    names = [f.path for f in copied.files]
    return HfModel(repo_id=repo_id, revision=revision, commit=commit, path=output_path,
                   model_type=config.get("model_type"), architectures=list(config.get("architectures") or []),
                   vocab_size=int(config["vocab_size"]), parameters=parameters, dtypes=dtypes, model=spec,
                   model_note=note, tokenizer=output_path if has_tokenizer(names) else None, files=copied.files,
                   bytes=copied.bytes)


def weights_match_headers(output_path: str, result: dict) -> CheckOutcome:
    """Every safetensors file is as long as its header says (8 + header + the last tensor's end offset): a
    truncated weight file fails here, not when a run loads it."""
    fs, root = fsspec.core.url_to_fs(output_path)
    wrong = []
    names = sorted(p for p in fs.ls(root.rstrip("/"), detail=False) if p.endswith(".safetensors"))
    for name in names:
        with fs.open(name, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(length))
        end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
        if fs.size(name) != 8 + length + end:
            wrong.append(f"{name.rsplit('/', 1)[-1]}: {fs.size(name)} bytes, header says {8 + length + end}")
    message = "; ".join(wrong) or f"{len(names)} safetensors file(s) match their headers"
    return CheckOutcome(bool(names) and not wrong, message if names else "no safetensors files",
                        {"files": len(names), "mismatched": len(wrong)})


WEIGHTS_MATCH_HEADERS = Check("weights_match_headers", weights_match_headers,
                              "Every safetensors file has the length its header gives.")


def hf_model_step(name: str, repo_id: str, revision: str, include: Sequence[str] = MODEL_FILES) -> Step:
    """A Hugging Face model at `revision`, copied into a model folder: `from_hf(step)` starts a run from it,
    `hf_to_levanter_step` converts it. A commit sha pins it for good; a branch or tag is resolved to its commit
    when materialized (recorded as `commit`), and the source sensor sees it move.

    Identity: `repo_id`, `revision`, `include`.
    """
    if not repo_id or repo_id.count("/") > 1 or repo_id.strip() != repo_id:
        raise StepDefinitionError(f"step {name!r}: {repo_id!r} is not a Hugging Face repository id (`org/name`)")
    if not revision:
        raise StepDefinitionError(f"step {name!r}: give a revision (a commit sha, a branch or a tag) of {repo_id}")
    return Step(
        name=name,
        fn=lambda out: download_hf_model(out, repo_id, revision, include),
        hash_attrs={"repo_id": repo_id, "revision": revision, "include": list(include)},
        kind="model",
        description=made_by(download_hf_model),
        source_version=None if is_commit_sha(revision) else lambda: hf_source_version(repo_id, revision, "model"),
        kinds=["huggingface"],
        checks=[FILES_MATCH_RECORD, WEIGHTS_MATCH_HEADERS],
    )


__all__ = ["MODEL_FILES", "HfModel", "HfModelError", "check_model_repo", "download_hf_model", "has_tokenizer",
           "hf_model_step", "model_spec_of", "safetensors_summary"]
