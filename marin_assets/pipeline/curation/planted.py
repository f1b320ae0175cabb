"""A corpus with known defects planted in real text: what curation's precision and recall are measured on.

The base is real English — the running Python's documentation (`python_docs`), documents of at least
`MIN_WORDS` words, at most a few per module and none a near-duplicate of another (5-gram Jaccard
below 0.3), so what a stage removes from the base is a false positive. Planted, deterministically
from `seed`, each later part from its own random stream (so changing how one part is planted redraws no
other; the base and exact duplicates are drawn as they always were), with words counted as the stages
count them (`ngrams`) wherever a premise depends on it:

- exact duplicates: some base documents copied 2–4 times;
- near-duplicates: copies with a known number of words replaced (`NEAR_EDITS`), each a token that is one
  word, so an edit changes at most five word 5-grams: whatever the Python's text, copies with 1 or 2 edits
  keep 5-gram Jaccard 0.8 or more (fuzzy dedup's default threshold) and every edit count has a copy that
  does (`GRAMS_PER_EDIT`); and far copies with half of their words replaced (not duplicates: a stage must
  keep them);
- a repeated paragraph (a boilerplate line) appended to several base documents (paragraph dedup);
- low-quality documents of named kinds (`LOW_QUALITY_KINDS`): symbol runs, repeated lines, very short,
  word salad without stop words, digits, over-long words;
- contamination: paragraphs of two evaluation sets (one line each, from documentation sharing no word
  13-gram with the corpus) inserted into documents, and near misses that share only a 10-word phrase with
  one (fewer words than decontamination's 13-grams).

Written as raw JSON lines (`train/shard-00000.jsonl.gz`, the format normalize reads; `validation/` holds
clean held-out documents, so the corpus can be tokenized and trained on like any dataset), the evaluation
sets as `evalsets/{name}.jsonl` (not `eval/`: that name is read as a split), labeled data for a quality
classifier as `labeled/{positive,negative}/`
(disjoint from the corpus), and the ground truth as `truth.json`, keyed by document id (the content
hash normalize gives every document, so truth survives every stage).
"""

from __future__ import annotations

import json
import random
import re
import sysconfig
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from marin_assets.core.files import atomic_write, read_bytes
from marin_assets.core.paths import join_path
from marin_assets.core.record_types import record_type
from marin_assets.core.step import Step, made_by
from marin_assets.pipeline.curation.ngrams import ngram_hashes
from marin_assets.pipeline.curation.shards import document_id
from marin_assets.pipeline.data.corpus import write_jsonl_shards
from marin_assets.pipeline.data.python_docs import PythonBuild, PythonDocsError, python_documents

MIN_WORDS = 80
NEAR_EDITS = (1, 2, 4, 8)
"""Words replaced in near-duplicate copies."""
GRAMS_PER_EDIT = 45
"""e edits change at most 5e of a document's G distinct word 5-grams, so its copy keeps Jaccard at least
(G - 5e) / (G + 5e): 0.8 when G >= 45e. Near copies are made of documents of at least 90 (2 edits' worth),
and the first copy of each edit count of one of at least 45e."""
_WORD = re.compile(r"[A-Za-z0-9\u0080-\U0010ffff]+")
"""A word as `ngrams` counts words: a run of ASCII letters and digits or non-ASCII characters."""
FAR_FRACTION = 0.5
LOW_QUALITY_KINDS = ("symbols", "repeated_lines", "short", "word_salad", "digits", "long_words")
EVAL_SETS = ("stdlib-qa", "pydoc-reference")
BOILERPLATE = ("This documentation is part of the planted corpus and is repeated verbatim in several documents so"
               " that paragraph deduplication has something to find.")


@dataclass(frozen=True)
class NearDuplicate:
    """A planted copy of `original` with `edits` words replaced."""

    original: str
    copy: str
    edits: int
    """Words replaced; `far` copies have half their words replaced."""
    words: int
    far: bool = False


@dataclass(frozen=True)
class Contaminated:
    """A document holding one evaluation record's paragraph."""

    id: str
    eval_set: str
    eval_record: int
    """Line number (from 1) of the record in `evalsets/{eval_set}.jsonl`."""


@record_type("planted_truth")
@dataclass(frozen=True)
class PlantedTruth:
    """What was planted, by document id."""

    base_ids: list[str]
    """Clean, distinct base documents (real text) of the train split: removing one is a false positive."""
    exact_duplicates: dict[str, int]
    """id → copies in the corpus (2 or more); one should remain."""
    near_duplicates: list[NearDuplicate]
    repeated_paragraph: str
    repeated_paragraph_ids: list[str]
    """Documents (base text + the boilerplate line) holding `repeated_paragraph`."""
    low_quality: dict[str, str]
    """id → kind."""
    contaminated: list[Contaminated]
    near_misses: list[str]
    """Documents sharing only a short phrase with an evaluation record: not contaminated."""
    eval_sets: dict[str, str] = field(default_factory=dict)
    """name → path of its JSON lines (`{"text": ...}` per record)."""
    documents: int = 0
    """Of the train split; `validation/` holds `validation_ids`, clean documents no other split has."""
    validation_ids: list[str] = field(default_factory=list)


def load_truth(corpus_path: str) -> PlantedTruth:
    """The truth a planted corpus was written with."""
    data = json.loads(read_bytes(join_path(corpus_path, "truth.json")) or b"null")
    if data is None:
        raise FileNotFoundError(f"{corpus_path}: no truth.json (not a planted corpus)")
    return PlantedTruth(**{**data, "near_duplicates": [NearDuplicate(**n) for n in data["near_duplicates"]],
                           "contaminated": [Contaminated(**c) for c in data["contaminated"]]})


def _shingles(text: str, n: int = 5) -> set[tuple[str, ...]]:
    words = text.lower().split()
    return {tuple(words[i:i + n]) for i in range(max(len(words) - n + 1, 1))}


def _distinct_documents(limit_per_group: int = 6) -> tuple[list[str], list[str]]:
    """Real documentation texts of at least MIN_WORDS words, few per module, none near another; and the
    other documents."""
    documents, _ = python_documents(sysconfig.get_paths()["stdlib"], 40)
    per_group: dict[str, int] = {}
    chosen: list[tuple[str, set]] = []
    others: list[str] = []
    for d in documents:
        if len(d.text.split()) < MIN_WORDS or per_group.get(d.group, 0) >= limit_per_group:
            others.append(d.text)
            continue
        shingles = _shingles(d.text)
        if any(len(shingles & s) / len(shingles | s) >= 0.3 for _, s in chosen):
            others.append(d.text)
            continue
        per_group[d.group] = per_group.get(d.group, 0) + 1
        chosen.append((d.text, shingles))
    return [text for text, _ in chosen], others


def _one_line_paragraphs(texts: Sequence[str], min_words: int = 25) -> list[str]:
    """Paragraphs (blank-line separated) of at least `min_words` words, each re-flowed onto one line."""
    found = []
    for text in texts:
        for paragraph in text.split("\n\n"):
            words = paragraph.split()
            if len(words) >= min_words:
                found.append(" ".join(words))
    return found


def _word_grams(texts: Sequence[str], n: int) -> list[set[int]]:
    """Each text's distinct word n-grams (hashed), words as the stages count them (`ngrams`)."""
    hashes, offsets = ngram_hashes(texts, n)
    return [set(hashes[offsets[i]:offsets[i + 1]].tolist()) for i in range(len(texts))]


def _stream(seed: int, part: str) -> random.Random:
    """The draws of one part of the corpus: changing how one part is planted leaves the others as they were."""
    return random.Random(f"planted:{seed}:{part}")


def _near_originals(base: Sequence[str], count: int, rng: random.Random) -> list[str]:
    """Distinct documents to copy with `NEAR_EDITS[i % 4]` edits, each long enough for `GRAMS_PER_EDIT`."""
    grams = [len(g) for g in _word_grams(base, 5)]
    chosen: list[str] = []
    for i in range(count):
        edits = NEAR_EDITS[i % len(NEAR_EDITS)]
        least = GRAMS_PER_EDIT * (edits if i < len(NEAR_EDITS) else min(edits, 2))
        fits = [t for t, g in zip(base, grams, strict=True) if g >= least and t not in chosen]
        if not fits:
            raise ValueError(f"no base document of {least}+ distinct 5-grams left for a copy with {edits} edits")
        chosen.append(rng.choice(fits))
    return chosen


def _replace_words(text: str, count: int, rng: random.Random, vocabulary: Sequence[str],
                   one_word_tokens: bool = False) -> str:
    """`count` space-separated tokens replaced by vocabulary words; with `one_word_tokens`, only tokens that
    are one word as the stages count words, so each edit replaces exactly one word."""
    words = text.split(" ")
    eligible = [i for i, w in enumerate(words)
                if (len(_WORD.findall(w)) == 1 if one_word_tokens else w.strip())]
    positions = rng.sample(eligible, min(count, len(eligible)))
    for i in positions:
        words[i] = rng.choice(vocabulary)
    return " ".join(words)


def _low_quality(kind: str, rng: random.Random, vocabulary: Sequence[str]) -> str:
    words = [rng.choice(vocabulary) for _ in range(120)]
    if kind == "symbols":
        return " ".join(w if i % 3 else "#### {{ }} ;; ||" for i, w in enumerate(words))
    if kind == "repeated_lines":
        return "\n".join([" ".join(words[:8])] * 25 + [" ".join(words[8:20])])
    if kind == "short":
        return " ".join(words[:rng.randint(3, 12)])
    if kind == "word_salad":
        return " ".join("".join(rng.choice("bcdfghjklmnpqrstvwxz") for _ in range(rng.randint(3, 8)))
                        for _ in range(150))
    if kind == "digits":
        return " ".join(str(rng.randint(0, 10**rng.randint(1, 8))) for _ in range(150))
    if kind == "long_words":
        return " ".join("".join(rng.choice(vocabulary) for _ in range(4)) for _ in range(100))
    raise ValueError(kind)


def plant_corpus(output_path: str, seed: int = 0, base_documents: int = 200, exact_duplicates: int = 20,
                 near_duplicates: int = 32, low_quality: int = 36, contaminated: int = 20,
                 eval_records: int = 40, labeled: int = 120, validation_documents: int = 24) -> PlantedTruth:
    """Write the planted corpus, its evaluation sets, labeled quality data and truth under `output_path`."""
    pool, others = _distinct_documents()
    rng = random.Random(seed)  # the base split and the exact duplicates: drawn as in planted-v1
    rng.shuffle(pool)
    base, rest = pool[:base_documents], pool[base_documents:]
    if len(base) < base_documents or len(rest) < labeled + 2 * contaminated + 12:
        raise ValueError(f"only {len(pool)} distinct documents of {MIN_WORDS}+ words in this Python's documentation")
    vocabulary = sorted({w for text in base for w in text.split() if w.isalpha() and w.islower()})
    records: list[str] = list(base)
    truth = PlantedTruth([document_id(t) for t in base], {}, [], BOILERPLATE, [], {}, [], [])

    for text in rng.sample(base, exact_duplicates):
        copies = rng.randint(2, 4)
        records += [text] * (copies - 1)
        truth.exact_duplicates[document_id(text)] = copies
    rng = _stream(seed, "near")
    originals = _near_originals(base, near_duplicates, rng)
    taken = set(originals)
    originals += rng.sample([t for t in base if t not in taken], near_duplicates // 4)
    for i, text in enumerate(originals):
        far = i >= near_duplicates
        words = len(text.split())
        edits = int(words * FAR_FRACTION) if far else NEAR_EDITS[i % len(NEAR_EDITS)]
        copy = _replace_words(text, edits, rng, vocabulary, one_word_tokens=not far)
        records.append(copy)
        truth.near_duplicates.append(NearDuplicate(document_id(text), document_id(copy), edits, words, far))
    for text in rest[:12]:
        with_boilerplate = text + "\n" + BOILERPLATE
        records.append(with_boilerplate)
        truth.repeated_paragraph_ids.append(document_id(with_boilerplate))
    carriers = rest[12:]
    rng = _stream(seed, "junk")
    for i in range(low_quality):
        kind = LOW_QUALITY_KINDS[i % len(LOW_QUALITY_KINDS)]
        text = _low_quality(kind, rng, vocabulary)
        records.append(text)
        truth.low_quality[document_id(text)] = kind

    in_corpus = set().union(*_word_grams(pool, 13))  # 13-grams as decontaminate counts them
    candidates = _one_line_paragraphs(others)
    paragraphs = [p for p, grams in zip(candidates, _word_grams(candidates, 13), strict=True) if not grams & in_corpus]
    rng = _stream(seed, "contamination")
    rng.shuffle(paragraphs)
    eval_lines = {name: paragraphs[i * eval_records:(i + 1) * eval_records] for i, name in enumerate(EVAL_SETS)}
    if any(len(lines) < eval_records for lines in eval_lines.values()):
        raise ValueError(f"not enough documentation paragraphs for {len(EVAL_SETS)} sets of {eval_records} records")
    for i in range(contaminated + contaminated // 2):  # carriers are taken from the front, positives from the back
        name = EVAL_SETS[i % len(EVAL_SETS)]
        number = rng.randrange(eval_records)
        record = eval_lines[name][number]
        carrier = carriers.pop(0)
        if i < contaminated:
            text = carrier.rstrip() + "\n" + record
            truth.contaminated.append(Contaminated(document_id(text), name, number + 1))
        else:  # ten words as the stages count them: no 13-gram of the record
            spans = list(_WORD.finditer(record))
            start = rng.randrange(max(len(spans) - 10, 1))
            phrase = record[spans[start].start():spans[min(start + 10, len(spans)) - 1].end()]
            text = carrier.rstrip() + "\nAs noted, " + phrase + "."
            truth.near_misses.append(document_id(text))
        records.append(text)
    validation, positives = carriers[:validation_documents], carriers[validation_documents:][-labeled:]
    if len(positives) < labeled or len(validation) < validation_documents:
        raise ValueError(f"not enough documentation left for {labeled} labeled positives")
    rng = _stream(seed, "labeled")
    negatives = [_low_quality(LOW_QUALITY_KINDS[i % len(LOW_QUALITY_KINDS)], rng, vocabulary) for i in range(labeled)]

    _stream(seed, "order").shuffle(records)
    write_jsonl_shards(output_path, "train", [{"text": t} for t in records], 2)
    write_jsonl_shards(output_path, "validation", [{"text": t} for t in validation], 1)
    for label, texts in (("positive", positives), ("negative", negatives)):
        write_jsonl_shards(join_path(output_path, "labeled", label), "train", [{"text": t} for t in texts], 1)
    for name, lines in eval_lines.items():
        path = join_path(output_path, "evalsets", f"{name}.jsonl")
        atomic_write(path, "".join(json.dumps({"text": line}) + "\n" for line in lines).encode())
        truth.eval_sets[name] = path
    done = PlantedTruth(**{**truth.__dict__, "documents": len(records),
                           "validation_ids": [document_id(t) for t in validation]})
    atomic_write(join_path(output_path, "truth.json"), json.dumps(asdict(done), indent=1).encode())
    return done


def planted_corpus_step(name: str, seed: int = 0, python: PythonBuild | None = None) -> Step:
    """The planted corpus (real documentation with known duplicates, junk and contamination) as a raw dataset.
    Its text is a Python build's documentation, so the build (default: the running one) is identity.

    Identity: `seed`, `python` and the planting's version.
    """
    python = python or PythonBuild.current()

    def plant(out: str) -> PlantedTruth:
        if PythonBuild.current() != python:
            raise PythonDocsError(f"this step's identity is for {python}'s documentation, but it runs under"
                                  f" {PythonBuild.current()}: run it where that Python is, or define it here")
        return plant_corpus(out, seed)

    return Step(name=name, fn=plant, hash_attrs={"seed": seed, "python": python, "format": "planted-v2"},
                kind="generate", description=made_by(plant_corpus))
