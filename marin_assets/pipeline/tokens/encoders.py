"""Texts → token ids, exactly and fast: document framing, three backends, and the parity check between them.

Framing is explicit: a document is encoded *without* special tokens, then its BOS/EOS are added as
ids. (Levanter's BatchTokenizer instead appends EOS as text, `text + " " + eos`: one spurious space
token per document with byte-level BPEs.) The framing is part of a cache's identity; `levanter` keeps
Levanter's own framing for caches meant to be shared with existing Marin/Levanter runs.

Three backends produce the same ids: Hugging Face `tokenizers` (the reference: the object transformers
and Levanter use), `gigatoken` (Rust, byte-level and SentencePiece BPE, OpenAI's encodings from their
`.tiktoken` files; ids as one flat buffer and offsets; the fastest) and `fastokens` (Rust, Hugging Face
parity, ids returned as one buffer with no Python int per token; ~10× faster than `tokenizers` on a
100k-vocabulary BPE). The first of gigatoken and fastokens that loads the tokenizer and agrees with
`tokenizers` id for id on a sample of the input is used, else `tokenizers`; the choice and its reason are
recorded (and a tokenizer a backend refuses is tried once per process). Ids always travel as numpy arrays:
`(ids, ends)`, `ends[i]` = end of document i in `ids`. `Encoder.start` / `Encoder.assemble` split an encode into
the Rust call and the array work after it, so that a pipeline runs them on two threads.
"""

from __future__ import annotations

import functools
import itertools
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from marin_assets.core.files import read_bytes
from marin_assets.core.paths import join_path
from marin_assets.pipeline.tokens.tokenizer import TokenizerError, load_hf_tokenizer, openai_rank_files

FRAMINGS = ("bos_eos", "eos", "levanter")
"""`bos_eos`: BOS id (if the tokenizer has a BOS token) + tokens + EOS id; `eos`: tokens + EOS id;
`levanter`: exactly what Levanter's BatchTokenizer makes (its cache format for shared Marin caches)."""
BACKENDS = ("auto", "gigatoken", "fastokens", "tokenizers")
FAST_BACKENDS = ("gigatoken", "fastokens")
"""Tried in this order by `auto`: each only where it loads the tokenizer and agrees with `tokenizers`."""
PARITY_PROBES = ("", " ", "  \n\n\t x", "Hello, world! 12345 678 3.14", "naïve café — 東京 🤖 Ωμέγα",
                 "don't I'll we've THEY'RE", "    indented\n        code()\n")
"""Texts added to every parity sample: whitespace runs, digits, contractions and non-Latin scripts,
where tokenizer implementations differ first."""


class BackendError(ValueError):
    """A forced backend cannot be used."""


@dataclass(frozen=True)
class Framing:
    """How documents are delimited in a cache: which ids surround each document's tokens."""

    style: str
    """One of FRAMINGS."""
    bos_id: int | None
    """Prepended to every document (None: nothing)."""
    eos_id: int | None
    """Appended to every document (None: nothing; with `levanter` style, Levanter decides)."""
    bos_token: str | None = None
    eos_token: str | None = None


def framing_of(tokenizer: Any, style: str, where: str = "") -> Framing:
    """The framing `style` means for a transformers tokenizer; a style needing an EOS the tokenizer
    lacks is an error (documents would run into each other)."""
    if style not in FRAMINGS:
        raise ValueError(f"{where}unknown framing {style!r}; choose one of {', '.join(FRAMINGS)}")
    if style == "levanter":
        return Framing(style, None, None, tokenizer.bos_token, tokenizer.eos_token)
    if tokenizer.eos_token_id is None:
        raise TokenizerError(f"{where}the tokenizer has no EOS token, which framing {style!r} appends to every"
                             " document; adopt a tokenizer with one")
    bos = tokenizer.bos_token_id if style == "bos_eos" else None
    return Framing(style, bos, tokenizer.eos_token_id, tokenizer.bos_token if bos is not None else None,
                   tokenizer.eos_token)


def frame(ids: np.ndarray, ends: np.ndarray, framing: Framing) -> tuple[np.ndarray, np.ndarray]:
    """Insert BOS/EOS ids around every document of a flat batch, without a Python loop over tokens: the
    framing ids go to their places and a boolean mask takes the tokens (no index array per token). `ids` may be
    any integer dtype (fastokens' uint32 buffer is cast once, here)."""
    bos, eos = framing.bos_id, framing.eos_id
    b, e = int(bos is not None), int(eos is not None)
    if not b and not e:
        return ids.astype(np.int32, copy=False), ends
    n = len(ends)
    new_ends = ends + np.arange(1, n + 1, dtype=np.int64) * (b + e)
    out = np.empty(int(new_ends[-1]) if n else 0, dtype=np.int32)
    tokens = np.ones(len(out), dtype=bool)
    if bos is not None:
        starts = new_ends - np.diff(ends, prepend=0) - b - e
        out[starts] = bos
        tokens[starts] = False
    if eos is not None:
        out[new_ends - 1] = eos
        tokens[new_ends - 1] = False
    out[tokens] = ids
    return out, new_ends


def _flatten(rows: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    ends = np.cumsum([len(r) for r in rows], dtype=np.int64)
    ids = np.fromiter(itertools.chain.from_iterable(rows), dtype=np.int32, count=int(ends[-1]) if len(rows) else 0)
    return ids, ends


@functools.lru_cache(maxsize=8)
def hf_tokenizer(tokenizer_path: str) -> Any:
    """The transformers tokenizer (once per process and content-addressed folder)."""
    return load_hf_tokenizer(tokenizer_path)


def _reference(tokenizer_path: str) -> Any:
    """The `tokenizers` object transformers (and Levanter) encode with: the reference for parity."""
    rust = getattr(hf_tokenizer(tokenizer_path), "backend_tokenizer", None)
    if rust is None:
        raise TokenizerError(f"the tokenizer at {tokenizer_path} has no fast (Rust) implementation; adopt a"
                             " tokenizer folder with a tokenizer.json")
    return rust


def _loaded(found: tuple[Any, Exception | None]) -> Any:
    """A backend's tokenizer as `*_or_refusal` remembered it, or the error it refused it with (raised again on every
    call)."""
    loaded, refusal = found
    if refusal is not None:
        raise refusal.with_traceback(None)
    return loaded


def _fastokens(tokenizer_path: str) -> Any:
    """fastokens' tokenizer for a folder, or the error it refused it with."""
    return _loaded(_fastokens_or_refusal(tokenizer_path))


@functools.lru_cache(maxsize=8)
def _fastokens_or_refusal(tokenizer_path: str) -> tuple[Any, Exception | None]:
    """Loaded once per process and (content-addressed, unchanging) folder, a refusal included: fastokens takes
    as long to refuse a 100k vocabulary (an id gap, say) as to load one, and the fallback path would pay it again
    for every cache."""
    import fastokens

    try:
        raw = read_bytes(join_path(tokenizer_path, "tokenizer.json"))
        if raw is None:
            raise TokenizerError(f"no tokenizer.json in {tokenizer_path}")
        return fastokens.Tokenizer.from_json_str(raw.decode()), None
    except Exception as e:  # noqa: BLE001 — any refusal means: use the reference
        return None, e


def _gigatoken(tokenizer_path: str) -> Any:
    """gigatoken's tokenizer for a folder, or the error it refused it with."""
    return _loaded(_gigatoken_or_refusal(tokenizer_path))


@functools.lru_cache(maxsize=8)
def _gigatoken_or_refusal(tokenizer_path: str) -> tuple[Any, Exception | None]:
    """Loaded once per process and folder, a refusal included: from an OpenAI encoding's `.tiktoken` ranks when the
    folder holds one (gigatoken's own loader: transformers' conversion of those encodings' split regex, with
    possessive quantifiers, is one gigatoken refuses), else from `tokenizer.json`."""
    import gigatoken

    from marin_assets.pipeline.data.text_files import local_copy_of

    try:
        with local_copy_of(tokenizer_path) as local:
            ranks = openai_rank_files(local)
            if ranks:  # the file's name says which encoding it is
                return gigatoken.Tokenizer.from_tiktoken(os.path.join(local, ranks[0])), None
            if not os.path.exists(os.path.join(local, "tokenizer.json")):
                raise TokenizerError(f"no tokenizer.json in {tokenizer_path}")
            return gigatoken.Tokenizer(os.path.join(local, "tokenizer.json")), None
    except Exception as e:  # noqa: BLE001 — any refusal means: try the next backend
        return None, e


def _gigatoken_raw(tokenizer_path: str, texts: Sequence[str]) -> Any:
    """gigatoken's ids of `texts` (an awkward array: one flat buffer and offsets; the GIL is released)."""
    return _gigatoken(tokenizer_path).encode_batch(list(texts))


def _gigatoken_flat(encoded: Any) -> tuple[np.ndarray, np.ndarray]:
    """gigatoken's buffers as arrays without a copy: ids stay uint32 (framing casts them once), ends from 0."""
    import awkward as ak

    layout = ak.to_layout(encoded)
    offsets = np.asarray(layout.offsets.data).astype(np.int64, copy=False)
    ids = np.asarray(layout.content.data)
    return ids[offsets[0]:offsets[-1]] if len(offsets) else ids[:0], offsets[1:] - offsets[0]


def encode_gigatoken(tokenizer_path: str, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Unframed ids of `texts` by gigatoken."""
    ids, ends = _gigatoken_flat(_gigatoken_raw(tokenizer_path, texts))
    return ids.astype(np.int32), ends


def _tokenizers_raw(tokenizer_path: str, texts: Sequence[str]) -> list[Any]:
    """`tokenizers`' encodings of `texts` (`encode_batch_fast` skips the offsets; the GIL is released)."""
    rust = _reference(tokenizer_path)
    encode_batch = getattr(rust, "encode_batch_fast", rust.encode_batch)
    return encode_batch(list(texts), add_special_tokens=False)


def _tokenizers_flat(encodings: list[Any]) -> tuple[np.ndarray, np.ndarray]:
    """Encodings → (ids, ends): the Python work of this backend (`e.ids` makes a list per document)."""
    return _flatten([e.ids for e in encodings])


def encode_tokenizers(tokenizer_path: str, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Unframed ids of `texts` by Hugging Face `tokenizers` (`encode_batch_fast` skips the offsets)."""
    return _tokenizers_flat(_tokenizers_raw(tokenizer_path, texts))


def _fastokens_raw(tokenizer_path: str, texts: Sequence[str]) -> tuple[Any, Any]:
    """fastokens' two buffers for `texts` (the GIL is released while they are made)."""
    return _fastokens(tokenizer_path).encode_batch_flat(list(texts), add_special_tokens=False)


def _fastokens_flat(buffers: tuple[Any, Any]) -> tuple[np.ndarray, np.ndarray]:
    """fastokens' buffers as arrays, without a copy: ids stay little-endian uint32 (framing casts them once)."""
    ids, offsets = buffers
    return np.frombuffer(ids, dtype="<u4"), np.frombuffer(offsets, dtype="<u8")[1:].astype(np.int64)


def encode_fastokens(tokenizer_path: str, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Unframed ids of `texts` by fastokens: one little-endian uint32 buffer and uint64 offsets."""
    ids, ends = _fastokens_flat(_fastokens_raw(tokenizer_path, texts))
    return ids.astype(np.int32), ends


ENCODERS = {"tokenizers": encode_tokenizers, "fastokens": encode_fastokens, "gigatoken": encode_gigatoken}
_STAGES: dict[str, tuple[Callable[[str, Sequence[str]], Any], Callable[[Any], tuple[np.ndarray, np.ndarray]]]] = {
    "tokenizers": (_tokenizers_raw, _tokenizers_flat), "fastokens": (_fastokens_raw, _fastokens_flat),
    "gigatoken": (_gigatoken_raw, _gigatoken_flat)}
_LOADERS: dict[str, Callable[[str], Any]] = {"gigatoken": _gigatoken, "fastokens": _fastokens}
"""Each backend in two stages: the Rust call (GIL released) and turning its output into arrays (Python and
numpy work), so that a pipeline can run the second stage of one batch while the first runs on the next."""


@dataclass(frozen=True)
class BackendChoice:
    """Which backend tokenizes, and why (recorded with the cache)."""

    backend: str
    reason: str


def choose_backend(tokenizer_path: str, sample: Sequence[str], requested: str = "auto") -> BackendChoice:
    """The first of gigatoken and fastokens that loads the tokenizer and matches `tokenizers` id for id on `sample`
    (plus probes); else `tokenizers`. The reason names every backend passed over and why.

    `requested="tokenizers"` skips both; `requested="gigatoken"` or `"fastokens"` insists on that one (an error if
    it cannot load the tokenizer; a disagreement is recorded, not hidden).
    """
    if requested not in BACKENDS:
        raise ValueError(f"unknown tokenize backend {requested!r}; choose one of {', '.join(BACKENDS)}")
    if requested == "tokenizers":
        return BackendChoice("tokenizers", "requested")
    texts = list(PARITY_PROBES) + [t for t in sample]
    passed_over = []
    for backend in FAST_BACKENDS if requested == "auto" else (requested,):
        try:
            _LOADERS[backend](tokenizer_path)
        except Exception as e:  # noqa: BLE001 — any refusal means: the next backend
            if requested == backend:
                raise BackendError(f"{backend} cannot load the tokenizer at {tokenizer_path}: {e}") from None
            passed_over.append(f"{backend} cannot load this tokenizer ({_first_line(e)})")
            continue
        disagreement, tokens = parity_difference(tokenizer_path, texts, backend)
        if disagreement is None:
            agrees = f"{backend} agrees with tokenizers on {len(texts)} sample documents ({tokens} tokens)"
            return BackendChoice(backend, "; ".join([*passed_over, agrees]))
        if requested == backend:
            return BackendChoice(backend, f"requested, although it disagrees with tokenizers: {disagreement}")
        passed_over.append(f"{backend} disagrees with tokenizers: {disagreement}")
    return BackendChoice("tokenizers", "; ".join(passed_over))


def parity_difference(tokenizer_path: str, texts: Sequence[str], backend: str = "fastokens") -> tuple[str | None, int]:
    """Where `backend`'s ids first differ from `tokenizers`' on `texts` (None: identical), and how many tokens
    `tokenizers` made."""
    ref_ids, ref_ends = encode_tokenizers(tokenizer_path, texts)
    fast_ids, fast_ends = ENCODERS[backend](tokenizer_path, texts)
    if np.array_equal(ref_ends, fast_ends) and np.array_equal(ref_ids, fast_ids):
        return None, len(ref_ids)
    ref_starts, fast_starts = np.diff(ref_ends, prepend=0), np.diff(fast_ends, prepend=0)
    for i, text in enumerate(texts):
        a = ref_ids[ref_ends[i] - ref_starts[i]:ref_ends[i]]
        b = fast_ids[fast_ends[i] - fast_starts[i]:fast_ends[i]]
        if not np.array_equal(a, b):
            at = next((k for k in range(min(len(a), len(b))) if a[k] != b[k]), min(len(a), len(b)))
            return (f"document {i} of the sample ({text[:40]!r}…): at token {at}, tokenizers gives"
                    f" {a[at:at + 3].tolist()}, {backend} {b[at:at + 3].tolist()}"), len(ref_ids)
    return "the batches differ", len(ref_ids)


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0][:200]


@dataclass(frozen=True)
class Encoder:
    """Encodes batches of document texts into framed ids for one tokenizer, framing and backend."""

    tokenizer_path: str
    framing: Framing
    backend: str

    def encode(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """(ids int32, ends int64) of the framed documents."""
        return self.assemble(self.start(texts))

    def start(self, texts: Sequence[str]) -> Any:
        """The first stage of `encode`: the tokenizer's own output for `texts` (made off the GIL by both Rust
        backends); `assemble` turns it into framed ids, possibly on another thread."""
        if not texts:
            return None
        if self.framing.style == "levanter":
            return _levanter_encode(self.tokenizer_path, texts)
        return _STAGES[self.backend][0](self.tokenizer_path, texts)

    def assemble(self, started: Any) -> tuple[np.ndarray, np.ndarray]:
        """(ids int32, ends int64) of the framed documents from what `start` returned."""
        if started is None:
            return np.empty(0, np.int32), np.empty(0, np.int64)
        if self.framing.style == "levanter":
            return started
        return frame(*_STAGES[self.backend][1](started), self.framing)


@functools.lru_cache(maxsize=16)
def encoder(tokenizer_path: str, framing: str = "bos_eos", backend: str = "tokenizers") -> Encoder:
    """The encoder for a tokenizer folder (loaded once per process; a content-addressed folder never changes)."""
    if backend not in ENCODERS:
        raise ValueError(f"unknown tokenize backend {backend!r}")
    return Encoder(tokenizer_path, framing_of(hf_tokenizer(tokenizer_path), framing), backend)


@functools.lru_cache(maxsize=8)
def _levanter_processor(tokenizer_path: str) -> Any:
    from marin_assets.pipeline.tokens import levanter_cache as lc

    return lc.batch_tokenizer(tokenizer_path, "text")


def _levanter_encode(tokenizer_path: str, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    rows = _levanter_processor(tokenizer_path)([{"text": t} for t in texts])
    return _flatten([r["input_ids"] for r in rows])
