"""Heuristic filters: each rule fires on a hand-made example and not on its twin just inside the threshold;
recall per planted junk kind and false positives on real documentation; identity; bad input; the protocol."""

import collections
import dataclasses
import pickle
import re
import shutil
import textwrap
import time

import pyarrow as pa
import pytest

from marin_assets import Step, materialize_step
from marin_assets.core.checks import run_check
from marin_assets.core.record import load_result, read_record
from marin_assets.pipeline.curation import heuristics
from marin_assets.pipeline.curation.heuristics import (
    RULE_NAMES,
    HeuristicFilter,
    HeuristicResult,
    HeuristicRules,
    failing_rule,
    heuristic_filter,
    heuristic_filter_step,
)
from marin_assets.pipeline.curation.shards import CurationError, Shard, list_shards, write_shard
from tests.support.curation import documents
from tests.support.helpers import FAST

PAPER_VALUES = {"c4_terminal_lines": 5, "c4_curly_bracket": True, "fineweb_line_punct": 0.12}
"""The papers' thresholds of the rules that are off by default."""


def only(rule: str) -> HeuristicRules:
    """Every rule off but `rule`, at its default (or, when off by default, the paper's) threshold."""
    value = PAPER_VALUES.get(rule, getattr(HeuristicRules(), rule))
    return HeuristicRules(**{name: value if name == rule else None for name in RULE_NAMES})


# --- hand-made documents ----------------------------------------------------------------------

PROSE = ("The open function returns a file object whose type depends on the mode. When a file is opened in text "
         "mode, reading returns strings decoded with the chosen encoding, while binary mode returns raw bytes. "
         "Buffering is controlled by an optional integer: zero switches it off, which is allowed only for binary "
         "files, and a positive value selects the size of a fixed chunk buffer. The newline argument controls how "
         "universal newlines work; it applies only to text files and may be None, an empty string, or one of the "
         "usual line endings.")
WORDS = PROSE.split()
CASUAL = ("ok so we are at the bus stop now and it is really freezing. mum said to be on it by six but the bus was "
          "not on time again. we might go to the museum if it remains dry, or we can sit in a bakery and eat a hot "
          "bun. i do not know yet. if you are up for it we can drive there. let me know by seven or so, and say "
          "hello to dad.")
"""79 words of 236 letters: mean 2.99; with "warm bun", 237 letters: exactly 3."""
JARGON = ("Localization considerations: the comprehensive documentation characterizes all straightforward "
          "implementation responsibilities regarding multilingual compatibility, accessibility requirements, "
          "bidirectional typesetting, pluralization algorithm, transliteration exceptions, standardization "
          "organizations, and locale-sensitive normalization of the identifier. Administrators occasionally "
          "underestimate the synchronization difficulties between translation repositories, documentation "
          "generators, and continuous integration infrastructure, so it is an art.")
"""49 words of 491 letters and digits: mean 10.02; with "requirement", 490: exactly 10."""
TELEGRAPH = ("Quarterly revenue rose sharply. Analysts expected weaker growth after last year's slump. Shares climbed "
             "nine percent in early trading. Management credited cloud subscriptions, strong demand from Asian "
             "markets, plus lower component costs. Guidance for next quarter remains cautious: executives cite "
             "currency swings, supply constraints, rising wages. Investors cheered anyway; several brokers raised "
             "price targets after Tuesday's call, noting healthier margins, record bookings, fewer returns.")
"""Business news without one of Gopher's stop words."""
CHANGES = ["Fixed a crash when the configuration file is empty", "Added a retry option to the download command",
           "Improved error messages for malformed JSON lines", "Dropped support for the legacy cache format",
           "Documented the environment variables the tool reads", "Sped up tokenization of long documents",
           "Made the progress bar respect the quiet flag", "Renamed the output folder option for clarity",
           "Checked checksums after every resumed download", "Removed a deprecated alias of the train command"]
QUESTIONS = ["Q. Did you read the contract before you signed it on that Monday morning?",
             "Q. Were the delivery dates written into the schedule attached to the contract?",
             "Q. Did the supplier ever tell you that the first shipment would be late?",
             "Q. Was anyone else from your company present during that telephone call?",
             "Q. Did you keep the notes you took during the meeting with the supplier?"]
MENU = ["Home", "Products and services", "Pricing plans", "Customer stories", "Documentation", "Developer blog",
        "Careers at the company", "Press kit", "Contact sales", "Status page", "Privacy settings", "Legal notices",
        "Partner program", "Events calendar", "Community forum", "Support center", "Release notes", "Security",
        "Accessibility statement", "Sitemap", "Newsletter signup", "Investor relations", "Brand guidelines",
        "Affiliate program", "Cookie preferences"]


def words(count: int) -> str:
    """The first `count` words of PROSE, cycling."""
    return " ".join(WORDS[i % len(WORDS)] for i in range(count))


def prose_of(length: int) -> str:
    """Prose of exactly `length` characters, ending in a period."""
    text = words(length)[:length - 1].rstrip() + "."
    return text + "s" * (length - len(text)) if len(text) < length else text


def lines(text: str, width: int = 60) -> list[str]:
    return textwrap.wrap(text, width)


def bullets(n: int) -> str:
    return "\n".join(["Changes in this release:"] + [f"- {c}." for c in CHANGES[:n]])


def ending_with_ellipsis(n: int) -> str:
    """Ten lines of prose, the first `n` trailing off with an ellipsis."""
    return "\n".join(line + "..." if i < n else line for i, line in enumerate(lines(PROSE, 52)[:10]))


def scores(nonalpha: int) -> str:
    """100 tokens: prose words with `nonalpha` of them numbers (match results and statistics)."""
    numbers = ["2", "1", "3-0", "45%", "12", "7.5", "2024", "0", "19:30", "88", "4", "16", "3", "1-1", "250",
               "9", "6", "31", "5", "27", "64", "11"]
    tokens = words(100 - nonalpha).split()
    for i in range(nonalpha):
        tokens.insert(min(i * 4 + 2, len(tokens)), numbers[i])
    return " ".join(tokens)


def transcript(yes: int) -> str:
    """Five questions, each answered; the first `yes` answers are the same line."""
    answers = ["A. Yes."] * yes + ["A. No.", "A. I do not recall.", "A. Only once.", "A. Twice."][:5 - yes]
    return "\n".join(line for pair in zip(QUESTIONS, answers, strict=True) for line in pair)


def faq(repeats: int) -> str:
    """Ten paragraphs: five answers, each followed by a short one; `repeats` + 1 of those are one paragraph."""
    short = ["See above."] * (repeats + 1) + ["See below.", "Not yet.", "Ask support.", "Yes."][:4 - repeats]
    answers = [" ".join(s) for s in (WORDS[0:14], WORDS[14:31], WORDS[31:50], WORDS[50:70], WORDS[70:93])]
    return "\n\n".join(p for pair in zip(answers, short, strict=True) for p in pair)


def menu(punctuated: int) -> str:
    """A site's navigation, 25 lines: the first `punctuated` end with a period."""
    return "\n".join(m + "." if i < punctuated else m for i, m in enumerate(MENU))


def listing(short: int) -> str:
    """100 lines of a code listing and its comments: `short` of them at most 30 characters."""
    long_line = "    result = normalize_whitespace(document.text, keep_newlines=True)  # {}"
    return "\n".join(f"x{i} = step({i})" if i < short else long_line.format(i) for i in range(100))


def terminal_lines(n: int) -> str:
    """A help text of which `n` lines (of 3+ words) end a sentence; the fifth introduces a list."""
    sentences = ["Configuration is read from three places.", "Values given on the command line win.",
                 "Environment variables come next.", "The configuration file is read last."]
    fifth = "The options the tool understands are these" + ("." if n >= 5 else ":")
    return "\n".join(sentences[:n] + [line.rstrip(".") for line in sentences[n:]] + [fifth, "verbose", "quiet",
                                                                                     "retries", "timeout"])


# --- reference measures (plain Python, for the cases whose threshold is a character fraction) -------------

def word_list(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def top_ngram(text: str, n: int) -> float:
    ws = word_list(text)
    grams = collections.Counter(tuple(ws[i:i + n]) for i in range(len(ws) - n + 1))
    most = max(grams.values())
    if most < 2:
        return 0.0
    longest = max(sum(map(len, g)) for g, c in grams.items() if c == most)
    return most * longest / len(text)


def dup_ngram(text: str, n: int) -> float:
    ws = word_list(text)
    seen, covered = set(), [False] * len(ws)
    for i in range(len(ws) - n + 1):
        gram = tuple(ws[i:i + n])
        if gram in seen:
            covered[i:i + n] = [True] * n
        seen.add(gram)
    return sum(len(w) for w, c in zip(ws, covered, strict=True) if c) / len(text)


def dup_line_chars(text: str) -> float:
    counts = collections.Counter(line for line in text.split("\n") if line.strip())
    return sum((c - 1) * len(line) for line, c in counts.items()) / len(text)


def fineweb_dup_chars(text: str) -> float:
    counts = collections.Counter(line for line in text.split("\n") if line.strip())
    return sum((c - 1) * len(line) for line, c in counts.items()) / len(text.replace("\n", ""))


def dup_paragraph_chars(text: str) -> float:
    counts = collections.Counter(p for p in text.split("\n\n") if p.strip())
    return sum((c - 1) * len(p) for p, c in counts.items()) / len(text)


def digit_fraction(text: str) -> float:
    solid = re.sub(r"\s", "", text)
    return sum(ch.isdigit() for ch in solid) / len(solid)


def crossing(make, measure, threshold: float, fails) -> tuple[str, str]:
    """(fail, twin): `make(k)` and `make(k + 1)` for the first k where the measure crosses into passing."""
    for k in range(0, 400):
        fail, twin = make(k), make(k + 1)
        if fails(measure(fail), threshold) and not fails(measure(twin), threshold):
            return fail, twin
    raise AssertionError("no crossing")


def above(value, threshold):
    return value > threshold


REFRAIN = "Tickets for the spring concert series are available at the box office"
DISCLAIMER = "This message was sent to subscribers of the community newsletter."
NEWS_2 = "New York"
NEWS_3 = "Bank of America"
NEWS_4 = "Internet of Things devices"
READINGS = ("Station 4 readings on 2024-03-18: 06:00 12.4 C 1013.2 hPa 81%; 09:00 14.9 C 1012.8 hPa 74%; "
            "12:00 17.3 C 1011.5 hPa 63%; 15:00 18.1 C 1010.9 hPa 58%; 18:00 15.6 C 1011.7 hPa 66%.")


def repeated_phrase(n: int):
    phrase = " ".join(REFRAIN.split()[:n])
    return lambda k: f"{phrase}. {words(k + 3)}. {phrase}."


def mentions(name: str):
    return lambda k: f"{words(k + 3)}. " + " ".join(f"{name} {w}." for w in ("rose", "fell", "held", "gained"))


CASES = {
    # rule: (document failing it, its twin just inside the threshold)
    "gopher_min_words": (words(49), words(50)),
    "gopher_max_words": (words(100_001), words(100_000)),
    "gopher_min_mean_word_length": (CASUAL, CASUAL.replace("hot bun", "warm bun")),
    "gopher_max_mean_word_length": (JARGON, JARGON.replace("requirements", "requirement")),
    # 60 words: 7 hashtags (0.117 per word) / 6 (0.1)
    "gopher_hash_ratio": tuple(" ".join("#" + w if i % 8 == 1 and i < 8 * n else w for i, w in
                                        enumerate(words(60).split())) for n in (7, 6)),
    "gopher_ellipsis_ratio": tuple(" ".join(w + "..." if i % 8 == 3 and i < 8 * n else w for i, w in
                                            enumerate(words(60).split())) for n in (7, 6)),
    "gopher_bullet_lines": (bullets(10), bullets(9)),  # 10 of 11 lines (0.91) / 9 of 10 (0.9)
    "gopher_ellipsis_lines": (ending_with_ellipsis(4), ending_with_ellipsis(3)),  # 0.4 / 0.3
    "gopher_alpha_words": (scores(21), scores(20)),  # 79% / 80% of tokens hold a letter
    "gopher_stop_words": (TELEGRAPH.replace("in early", "in the early"),
                          TELEGRAPH.replace("in early", "in the early").replace("from Asian", "from the Asian")),
    "gopher_dup_lines": (transcript(5), transcript(4)),  # 4 of 10 lines repeat one (0.4) / 3 (0.3)
    "gopher_dup_line_chars": crossing(lambda k: f"{DISCLAIMER}\n{words(k + 3)}\n{DISCLAIMER}", dup_line_chars, 0.2,
                                      above),
    "gopher_dup_paragraphs": (faq(4), faq(3)),  # 4 of 10 paragraphs repeat one (0.4) / 3 (0.3)
    "gopher_dup_paragraph_chars": crossing(lambda k: f"{DISCLAIMER}\n\n{words(k + 3)}\n\n{DISCLAIMER}",
                                           dup_paragraph_chars, 0.2, above),
    "gopher_top_2gram": crossing(mentions(NEWS_2), lambda t: top_ngram(t, 2), 0.2, above),
    "gopher_top_3gram": crossing(mentions(NEWS_3), lambda t: top_ngram(t, 3), 0.18, above),
    "gopher_top_4gram": crossing(mentions(NEWS_4), lambda t: top_ngram(t, 4), 0.16, above),
    **{f"gopher_dup_{n}gram": crossing(repeated_phrase(n), lambda t, n=n: dup_ngram(t, n), 0.15 - (n - 5) / 100,
                                       above) for n in range(5, 11)},
    "c4_terminal_lines": (terminal_lines(4), terminal_lines(5)),
    "c4_lorem_ipsum": ("LOREM IPSUM dolor sit amet. " + PROSE, "lorem_ipsum dolor sit amet. " + PROSE),
    "c4_curly_bracket": (PROSE + " Pass {'mode': 'rb'} as options.", PROSE + " Pass ('mode', 'rb') as options."),
    "fineweb_line_punct": (menu(3), menu(4)),  # 3 of 25 lines (0.12) / 4 (0.16)
    "fineweb_short_lines": (listing(67), listing(66)),  # 67 of 100 lines short / 66
    # the repeated line's 65 characters are exactly 10% of 650 (newlines not counted) / 9.98% of 651
    "fineweb_dup_line_chars": tuple(f"{DISCLAIMER}\n{prose_of(n)}\n{DISCLAIMER}" for n in (520, 521)),
    "digit_fraction": crossing(lambda k: f"{READINGS} {words(k + 1)}", digit_fraction, 0.3, above),
}


def test_every_rule_has_a_case():
    assert sorted(CASES) == sorted(RULE_NAMES)


@pytest.mark.parametrize("rule", RULE_NAMES)
def test_each_rule_fires_on_its_example_and_not_on_its_twin_just_inside(rule):
    fail, twin = CASES[rule]
    assert failing_rule(fail, only(rule)) == rule
    assert failing_rule(twin, only(rule)) is None
    if getattr(HeuristicRules(), rule) not in (None, False):  # on by default: the default rules remove it too
        assert failing_rule(fail) is not None


def test_words_are_measured_in_characters_not_bytes():
    russian = ("Функция open возвращает файловый объект, тип которого зависит от режима. В текстовом режиме чтение"
               " возвращает строки, декодированные выбранной кодировкой, а в двоичном режиме возвращаются байты без"
               " всякого преобразования. Буферизацией управляет необязательный целочисленный аргумент: ноль"
               " отключает её, что разрешено только в двоичном режиме, а положительное значение задаёт размер"
               " буфера. Аргумент newline определяет, как работают универсальные переводы строк.")
    assert failing_rule(russian, only("gopher_max_mean_word_length")) is None  # 7 letters a word, 13 bytes
    assert failing_rule(russian.replace(" ", "-"), only("gopher_max_mean_word_length")) is not None
    assert failing_rule(russian, only("gopher_alpha_words")) is None  # Cyrillic words are alphabetic


def test_the_reason_is_the_first_failing_rule_in_field_order():
    short_salad = "vswgrn wpxh dkf tjbq lpxls cmsrktb zqnjxpm"  # too short, and no stop words
    assert failing_rule(short_salad) == "gopher_min_words"
    assert failing_rule(short_salad, HeuristicRules(gopher_min_words=None)) == "gopher_stop_words"
    assert failing_rule(short_salad, HeuristicRules(gopher_min_words=None, gopher_stop_words=None)) is None
    assert failing_rule(PROSE) is None


def test_rules_refuse_bad_thresholds():
    with pytest.raises(ValueError, match=r"^heuristic_filter: rule gopher_min_words must be a non-negative number or"
                                         r" None, got -1"):
        HeuristicRules(gopher_min_words=-1)
    with pytest.raises(ValueError, match=r"^heuristic_filter: rule c4_lorem_ipsum is on \(True\) or off \(None\),"
                                         r" got 0\.5"):
        HeuristicRules(c4_lorem_ipsum=0.5)


def test_the_shard_decision_pickles_for_ray_tasks():
    table = pa.table({"id": ["a", "b"], "text": [PROSE, "too short"], "source": ["a:1", "a:2"]})
    chosen = pickle.loads(pickle.dumps(HeuristicFilter(HeuristicRules(gopher_stop_words=1))))
    verdicts = chosen.decide(table, Shard("train", 0, "in-memory"))
    assert verdicts.removed == [None, "gopher_min_words"] and verdicts.counters["fails:gopher_min_words"] == 1


# --- the planted corpus ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def filtered(planted, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("heuristics") / "out")
    started = time.process_time()
    result = heuristic_filter(out, planted.normalized)
    seconds = time.process_time() - started
    print(f"\nheuristic_filter: {result.bytes_in / 1e6:.2f} MB in {seconds:.2f} s of CPU:"
          f" {result.bytes_in / 1e6 / seconds:.1f} MB/s per core")
    return out, result


def test_planted_junk_is_removed_kind_by_kind(planted, filtered):
    out, result = filtered
    kept = {row["id"] for row in documents(out, ("id",))}
    kinds = collections.defaultdict(list)
    for doc_id, kind in planted.truth.low_quality.items():
        kinds[kind].append(doc_id)
    recall = {kind: sum(i not in kept for i in ids) / len(ids) for kind, ids in sorted(kinds.items())}
    print(f"\nrecall per kind: {recall}")
    assert len(recall) == 6 and all(r >= 5 / 6 for r in recall.values()), recall
    assert result.documents_in == planted.normalize_result.documents_out
    assert result.documents_in - result.documents_out == sum(r.documents for r in result.removed.values())
    assert set(result.removed) <= set(RULE_NAMES)
    assert all(result.failing[rule] >= removed.documents for rule, removed in result.removed.items())


def test_real_documentation_is_mostly_kept(planted, filtered):
    out, result = filtered
    kept = {row["id"] for row in documents(out, ("id",))}
    lost = [i for i in planted.truth.base_ids if i not in kept]
    print(f"\ndefault rules remove {len(lost)} of {len(planted.truth.base_ids)} real base documents")
    assert len(lost) <= 0.15 * len(planted.truth.base_ids)
    texts = {row["id"]: row["text"] for row in documents(planted.normalized)}
    base = [texts[i] for i in planted.truth.base_ids]
    everything = HeuristicRules(**{**dataclasses.asdict(HeuristicRules()), **PAPER_VALUES})
    rates = {rule: int(fails.sum()) for rule, fails in heuristics.failures(base, everything).items()}
    print(f"false positives per rule on {len(base)} real documents (every rule on): {rates}")
    for rule in PAPER_VALUES:  # off by default because they are too aggressive on real documentation
        assert rates[rule] >= 0.05 * len(base), (rule, rates[rule])
    for rule, n in rates.items():
        if getattr(HeuristicRules(), rule) not in (None, False):
            assert n < 0.05 * len(base), (rule, n)


def test_turning_a_rule_off_changes_identity_and_keeps_its_documents(planted, filtered, tmp_path):
    out, _ = filtered
    data = Step(name="curated/planted", fn=print, override_output_path=planted.normalized)
    default = heuristic_filter_step("curated/heuristics", data)
    off = heuristic_filter_step("curated/heuristics", data, HeuristicRules(gopher_stop_words=None))
    looser = heuristic_filter_step("curated/heuristics", data, HeuristicRules(gopher_stop_words=1))
    assert len({default.hash, off.hash, looser.hash}) == 3
    assert heuristic_filter_step("curated/heuristics", data, workers=4, max_removed_fraction=0.9).hash == default.hash
    salad = {i for i, kind in planted.truth.low_quality.items() if kind == "word_salad"}
    assert salad and not salad & {row["id"] for row in documents(out, ("id",))}
    result = heuristic_filter(str(tmp_path / "off"), planted.normalized, HeuristicRules(gopher_stop_words=None))
    assert salad <= {row["id"] for row in documents(str(tmp_path / "off"), ("id",))}
    assert "gopher_stop_words" not in result.removed and "gopher_stop_words" not in result.failing


def test_a_corrupt_shard_names_the_stage_and_the_file(tmp_path):
    good = pa.table({"id": ["a"], "text": [PROSE], "source": ["a.jsonl:1"]})
    write_shard(good, str(tmp_path / "data" / "train" / "part-00000.parquet"))
    (tmp_path / "data" / "train" / "part-00001.parquet").write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(CurationError, match=r"^heuristic_filter: shard .*data/train/part-00001\.parquet is"
                                            r" unreadable"):
        heuristic_filter(str(tmp_path / "out"), str(tmp_path / "data"))
    write_shard(pa.table({"id": ["a"], "body": [PROSE], "source": ["a.jsonl:1"]}),
                str(tmp_path / "nocol" / "train" / "part-00000.parquet"))
    with pytest.raises(CurationError, match=r"^heuristic_filter: shard .*nocol/train/part-00000\.parquet has no"
                                            r" column 'text'"):
        heuristic_filter(str(tmp_path / "out2"), str(tmp_path / "nocol"))


def test_the_step_through_the_protocol_records_rules_and_counts(planted, prefix, tmp_path):
    copy = tmp_path / "adopted"
    shutil.copytree(planted.normalized, copy, ignore=shutil.ignore_patterns("_work"))
    data = Step(name="curated/planted-normalized", fn=lambda out: None, override_output_path=str(copy))
    step = heuristic_filter_step("curated/planted-heuristics", data)
    materialize_step(data, prefix=prefix, settings=FAST)
    outcome = materialize_step(step, prefix=prefix, settings=FAST)
    record = read_record(outcome.output_path)
    rules = record.hash_attrs["rules"]
    assert rules["gopher_min_words"] == 50 and rules["c4_curly_bracket"] is None
    assert record.result["documents_in"] == planted.normalize_result.documents_out
    assert record.result["removed"]["gopher_min_words"]["documents"] >= 6  # the six planted short documents
    typed = load_result(outcome.output_path, HeuristicResult)
    assert typed.rules == HeuristicRules() and typed.failing["gopher_stop_words"] >= 6
    assert len(list_shards("test", outcome.output_path)) == len(list_shards("test", str(copy)))
    check = run_check(step.checks[0], outcome.output_path, record.result)
    assert check.passed and f"of {typed.documents_in} documents" in check.message
