"""Canonical encoding and identity: deterministic, strict, prefix-free."""

import dataclasses
import enum
import hashlib
import json
import pathlib
import subprocess
import sys

import pydantic
import pytest

from marin_assets.core.identity import (
    UnhashableAttrError,
    canonical,
    canonical_json,
    identity_hash,
)
from tests.support.helpers import subprocess_env


class Color(enum.Enum):
    RED = "red"


@dataclasses.dataclass(frozen=True)
class Opt:
    lr: float
    betas: tuple[float, float] = (0.9, 0.95)


class Model(pydantic.BaseModel):
    hidden: int
    layers: int = 2


def test_supported_values_encode_to_plain_json():
    value = {
        "opt": Opt(lr=3e-4),
        "model": Model(hidden=128),
        "color": Color.RED,
        "path": pathlib.Path("/data/x"),
        "tags": {"b", "a", "c"},
        "tuple": (1, 2),
        "none": None,
    }
    assert canonical(value) == {
        "opt": {"lr": 3e-4, "betas": [0.9, 0.95]},
        "model": {"hidden": 128, "layers": 2},
        "color": "red",
        "path": "/data/x",
        "tags": ["a", "b", "c"],
        "tuple": [1, 2],
        "none": None,
    }
    assert json.loads(canonical_json(value))["tags"] == ["a", "b", "c"]


def test_key_order_does_not_matter():
    assert identity_hash("x", {"a": 1, "b": 2}, []) == identity_hash("x", {"b": 2, "a": 1}, [])


def test_dep_order_does_not_matter_but_deps_do():
    h = identity_hash("x", {}, ["a_1", "b_2"])
    assert h == identity_hash("x", {}, ["b_2", "a_1"])
    assert h != identity_hash("x", {}, ["a_1", "b_3"])
    assert len(h) == 8 and int(h, 16) >= 0


def test_hash_is_the_same_in_another_process_with_another_hash_seed():
    code = ("from marin_assets.core.identity import identity_hash;"
            "print(identity_hash('n', {'s': {'x', 'y', 'z', 'w'}, 'd': {'k': 1.5}}, ['a_1']))")
    outs = {
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                       env=subprocess_env(PYTHONHASHSEED=str(seed))).stdout.strip()
        for seed in (1, 2, 3)
    }
    assert outs == {identity_hash("n", {"s": {"x", "y", "z", "w"}, "d": {"k": 1.5}}, ["a_1"])}


@pytest.mark.parametrize(
    "value, fragment",
    [
        ({"fn": len}, "hash_attrs['fn'] is a callable"),
        ({"fn": lambda x: x}, "is a callable"),
        ({"obj": object()}, "hash_attrs['obj'] is a builtins.object with no stable encoding"),
        ({"nested": {"deep": [1, object()]}}, "hash_attrs['nested']['deep'][1]"),
        ({"x": float("nan")}, "has no JSON encoding"),
        ({"m": {1: "a"}}, "keys must be strings"),
        ({"b": b"bytes"}, "no stable encoding"),
    ],
)
def test_values_without_a_stable_encoding_are_errors(value, fragment):
    with pytest.raises(UnhashableAttrError, match=None) as e:
        canonical(value)
    assert fragment in str(e.value)


# --- computed from the README's formulas alone, without the identity module ----------------------------

def readme_hash(name: str, attrs: dict, deps: list[str]) -> str:
    """README: `hash = sha256(canonical_json({"name": name, "attrs": attrs, "deps": sorted dep name_with_hash}))[:8]`,
    canonical JSON being sorted keys, no whitespace, text as UTF-8 (not escaped)."""
    payload = {"name": name, "attrs": attrs, "deps": sorted(deps)}
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:8]


def test_a_step_hash_is_the_readme_formula_computed_with_hashlib():
    from marin_assets import Step

    raw = Step(name="raw/numbers", fn=lambda out: None, hash_attrs={"n": 3})
    other = Step(name="data/extra", fn=lambda out: None, hash_attrs={})
    step = Step(name="tokenized/numbers", fn=lambda out: None, deps=[raw, other],
                hash_attrs={"opt": Opt(lr=3e-4), "mix": {"zeta": {"weights": [1, 2.5]}, "alpha": "café"}})
    raw_hash, other_hash = readme_hash("raw/numbers", {"n": 3}, []), readme_hash("data/extra", {}, [])
    assert (raw.hash, other.hash) == (raw_hash, other_hash)
    # The dataclass as its fields (a tuple as a list); the deps sorted ("data/…" before "raw/…").
    attrs = {"opt": {"lr": 0.0003, "betas": [0.9, 0.95]}, "mix": {"zeta": {"weights": [1, 2.5]}, "alpha": "café"}}
    expected = readme_hash("tokenized/numbers", attrs, [f"raw/numbers_{raw_hash}", f"data/extra_{other_hash}"])
    assert step.hash == expected and step.name_with_hash == f"tokenized/numbers_{expected}"
    assert len(expected) == 8 and expected != readme_hash("tokenized/numbers", attrs, [f"raw/numbers_{raw_hash}"])


def test_a_curated_document_id_is_xxh3_128_of_its_text(tmp_path):
    """README: a curated document's `id` is xxh3-128 of its text (its UTF-8 bytes, as 32 hex digits)."""
    import xxhash

    from marin_assets.pipeline.curation.normalize import normalize
    from tests.support.curation import documents

    texts = ["Ünïcode text\nwith two lines.", "plain ascii", "emoji 🙂 and CJK 漢字"]
    (tmp_path / "raw" / "train").mkdir(parents=True)
    (tmp_path / "raw" / "train" / "a.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    normalize(str(tmp_path / "out"), str(tmp_path / "raw"))
    rows = documents(str(tmp_path / "out"))
    assert [(r["text"], r["id"]) for r in rows] == [(t, xxhash.xxh3_128_hexdigest(t.encode("utf-8"))) for t in texts]
    assert all(len(r["id"]) == 32 for r in rows)
