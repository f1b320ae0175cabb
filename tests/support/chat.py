"""Chat data for the SFT tests: conversations whose assistant answers are real text (the standard
library's own docstrings, as `pipeline/data/python_docs.py` reads them), in OpenAI and ShareGPT form,
as JSON lines and parquet; and the assistant spans of a conversation, computed without Levanter."""

import io
import json
import random
import sysconfig
from pathlib import Path

from marin_assets.pipeline.data.python_docs import clean, docstrings

MODULES = ("json/__init__", "textwrap", "shlex", "fnmatch", "base64", "heapq", "bisect", "glob", "difflib",
           "statistics", "fractions", "calendar", "string", "keyword", "colorsys", "quopri")
"""Standard-library modules whose docstrings answer the questions (short, stable, plain English)."""
SYSTEM = "You answer questions about the Python standard library."
SHAREGPT_ROLES = {"system": "system", "user": "human", "assistant": "gpt"}


def doc_answers(max_chars: int = 160) -> list[tuple[str, str]]:
    """(dotted name, the first paragraph of its docstring) for the functions and classes of `MODULES`."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    found = []
    for module in MODULES:
        name = module.removesuffix("/__init__").replace("/", ".")
        for doc in docstrings(name, (stdlib / f"{module}.py").read_bytes()):
            if ":" not in doc.source.removeprefix("stdlib:"):
                continue  # the module's own docstring
            first = clean(doc.text).split("\n\n")[0].replace("\n", " ")
            if 20 <= len(first) <= max_chars:
                found.append((doc.source.split(":", 2)[1] + "." + doc.source.split(":", 2)[2], first))
    return found


def write_docs_dataset(root: Path) -> dict[str, int]:
    """The whole docstrings of `MODULES` as a text dataset (`train/`, and every tenth in `validation/`): what
    the tiny model is pretrained on before it learns to answer with them. Returns documents per split."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts = [clean(doc.text) for module in MODULES
             for doc in docstrings(module.removesuffix("/__init__").replace("/", "."),
                                   (stdlib / f"{module}.py").read_bytes())]
    splits = {"train": [t for i, t in enumerate(texts) if i % 10], "validation": texts[::10]}
    for split, docs in splits.items():
        write_jsonl(root / split / "docs.jsonl", [{"text": t} for t in docs])
    return {split: len(docs) for split, docs in splits.items()}


def conversations(count: int, seed: int) -> list[list[dict[str, str]]]:
    """`count` conversations (OpenAI messages): an optional system prompt, a question, its docstring as the
    answer, and — every other one — a follow-up question and answer."""
    answers = doc_answers()
    rng = random.Random(seed)
    made = []
    for i in range(count):
        (name, answer), (other, other_answer) = rng.sample(answers, 2)
        turns = [{"role": "system", "content": SYSTEM}] if i % 3 else []
        turns += [{"role": "user", "content": f"What does {name} do?"}, {"role": "assistant", "content": answer}]
        if i % 2:
            turns += [{"role": "user", "content": f"And {other}?"}, {"role": "assistant", "content": other_answer}]
        made.append(turns)
    return made


def sharegpt(conversation: list[dict[str, str]]) -> list[dict[str, str]]:
    """The same conversation in ShareGPT form."""
    return [{"from": SHAREGPT_ROLES[t["role"]], "value": t["content"]} for t in conversation]


def write_jsonl(path: Path, records: list[dict]) -> None:
    """Records as JSON lines (folders made as needed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def parquet_bytes(records: list[dict], row_group_size: int = 16) -> bytes:
    """Records as a parquet file (conversations become list<struct> columns), several row groups."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    sink = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(records), sink, row_group_size=row_group_size)
    return sink.getvalue()


def write_chat_dataset(root: Path, train: int, validation: int, seed: int) -> str:
    """A conversation dataset in all four combinations: `train/` holds OpenAI JSON lines, ShareGPT JSON lines
    and ShareGPT parquet; `validation/` OpenAI parquet. Returns the root."""
    convs = conversations(train + validation, seed)
    third = train // 3
    write_jsonl(root / "train" / "a.jsonl", [{"messages": c} for c in convs[:third]])
    write_jsonl(root / "train" / "b.jsonl", [{"conversations": sharegpt(c)} for c in convs[third:2 * third]])
    (root / "train" / "c.parquet").write_bytes(parquet_bytes([{"conversations": sharegpt(c), "id": i}
                                                              for i, c in enumerate(convs[2 * third:train])]))
    (root / "validation").mkdir(parents=True, exist_ok=True)
    (root / "validation" / "a.parquet").write_bytes(parquet_bytes([{"messages": c} for c in convs[train:]]))
    return str(root)


def assistant_positions(tokenizer, template: str, conversation: list[dict[str, str]]) -> set[int]:
    """Token positions of the assistant's turns, from prefixes rendered with the template: turn k's tokens
    run from the length of everything before it plus the generation prompt to the length through it."""
    def length(messages, prompt):
        return len(tokenizer.apply_chat_template(messages, chat_template=template, tokenize=True, return_dict=False,
                                                 add_generation_prompt=prompt))

    positions: set[int] = set()
    for k, turn in enumerate(conversation):
        if turn["role"] == "assistant":
            positions.update(range(length(conversation[:k], True), length(conversation[:k + 1], False)))
    return positions
