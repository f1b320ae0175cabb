"""html_to_text on real HTML: pydoc's pages of standard library modules inside a site's boilerplate
(navigation, cookie banner, scripts, styles, footer), as JSON lines and as WARC files written here
by the WARC/1.1 spec (several charsets, a compressed and chunked response, records that are no pages)."""

from __future__ import annotations

import gzip
import importlib
import json
import os
import pydoc
import sys
import time
import uuid
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from marin_assets.pipeline.curation.html_to_text import NO_MAIN_CONTENT, UNDECODABLE, extract_text, html_to_text
from marin_assets.pipeline.curation.shards import CurationError, document_id, list_shards, work_path
from marin_assets.pipeline.curation.stage import Removed
from tests.support.curation import documents, kill_when
from tests.support.helpers import FAST, subprocess_env

MODULES = ("textwrap", "heapq", "shlex", "fnmatch", "bisect", "colorsys", "string", "difflib", "json", "calendar")
COLUMNS = ("id", "text", "source", "url")

STYLE_AND_SCRIPT = ("<style>.cookie-banner{position:fixed;bottom:0} body{font-family:Georgia,serif}</style><script>"
                    "window.dataLayer=window.dataLayer||[];function gtag(){dataLayer.push(arguments);}</script>")
TOP = ('<header><nav class="navbar"><ul><li><a href="/">Home</a></li><li><a href="/downloads">Downloads</a></li>'
       '<li><a href="/community">Community forum</a></li><li><a href="/about">About us</a></li></ul></nav></header>'
       '<div class="cookie-banner" id="cookie-consent">We use cookies to improve your experience.'
       " <button>Accept all cookies</button></div>")
BOTTOM = ('<footer class="site-footer"><ul><li><a href="/privacy">Privacy policy</a></li>'
          '<li><a href="/terms">Terms of service</a></li></ul>'
          "<p>Copyright 2024 Example Docs Mirror. All rights reserved.</p></footer>"
          '<script>document.getElementById("cookie-consent").onclick=function(){trackVisitor("accepted")};</script>')
NAVIGATION = ("Downloads", "Community forum", "We use cookies", "Accept all cookies", "Privacy policy",
              "Terms of service", "Copyright 2024 Example Docs Mirror")
CODE = ("dataLayer", "trackVisitor", "font-family", "cookie-consent")
BOILERPLATE_ONLY = (f"<!DOCTYPE html><html><head><title>Example Docs</title>{STYLE_AND_SCRIPT}</head>"
                    f"<body>{TOP}{BOTTOM}</body></html>")


def documentation_page(module: str, extra: str = "") -> str:
    """pydoc's real HTML page of a standard library module, inside a site's boilerplate (and `extra`
    HTML at the top of the content)."""
    real = pydoc.html.page(module, pydoc.HTMLDoc().docmodule(importlib.import_module(module)))
    head, rest = real.split("<body>", 1)
    body, tail = rest.rsplit("</body>", 1)
    return (head.replace("</head>", STYLE_AND_SCRIPT + "</head>") + "<body>" + TOP + "<main><article>" + extra
            + body + "</article></main>" + BOTTOM + "</body>" + tail)


def summary(module: str) -> str:
    """The first line of a module's docstring: content every extraction of its page must keep."""
    return importlib.import_module(module).__doc__.strip().splitlines()[0]


def plain(text: str) -> str:
    """pydoc writes docstrings with non-breaking spaces; compare words, not spacing."""
    return text.replace("\xa0", " ")


def write_jsonl(path: Path, records: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = "".join(json.dumps(r) + "\n" for r in records).encode()
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)


# --- WARC/1.1 records, as the spec writes them ----------------------------------------------


def warc_record(kind: str, uri: str, block: bytes, content_type: str) -> bytes:
    """One WARC/1.1 record: version line, named fields, a blank line, the block, two CRLFs."""
    record_id = uuid.uuid5(uuid.NAMESPACE_URL, f"{kind} {uri} {len(block)}")
    fields = [("WARC-Type", kind), ("WARC-Record-ID", f"<urn:uuid:{record_id}>"), ("WARC-Date", "2024-05-01T12:00:00Z")]
    if uri:
        fields.append(("WARC-Target-URI", uri))
    fields += [("Content-Type", content_type), ("Content-Length", str(len(block)))]
    head = "WARC/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in fields) + "\r\n"
    return head.encode() + block + b"\r\n\r\n"


def response(uri: str, body: bytes, content_type: str = "text/html; charset=utf-8", status: str = "200 OK",
             **headers: str) -> bytes:
    http = f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n" + "".join(
        f"{k.replace('_', '-')}: {v}\r\n" for k, v in headers.items()) + "\r\n"
    return warc_record("response", uri, http.encode() + body, "application/http; msgtype=response")


def request(uri: str) -> bytes:
    host = uri.split("/")[2]
    return warc_record("request", uri, f"GET / HTTP/1.1\r\nHost: {host}\r\n\r\n".encode(),
                       "application/http; msgtype=request")


def warcinfo() -> bytes:
    return warc_record("warcinfo", "", b"software: marin-assets tests\r\nformat: WARC File Format 1.1\r\n",
                       "application/warc-fields")


def chunked(data: bytes, size: int = 1000) -> bytes:
    """HTTP/1.1 chunked transfer coding of `data`."""
    chunks = [data[i:i + size] for i in range(0, len(data), size)]
    return b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks) + b"0\r\n\r\n"


def warc_gz(records: list[bytes]) -> bytes:
    """A `.warc.gz`: every record its own gzip member, as crawlers write them."""
    return b"".join(gzip.compress(r) for r in records)


# --- fixtures ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> str:
    """A crawled documentation site as JSON lines: `train/` (two gzip files, the second ending with a
    page that is all boilerplate) and `validation/`, each page with its `url`."""
    root = tmp_path_factory.mktemp("site")
    pages = [{"url": f"https://docs.example.org/{m}.html", "html": documentation_page(m)} for m in MODULES]
    write_jsonl(root / "train" / "pages-00000.jsonl.gz", pages[:4])
    write_jsonl(root / "train" / "pages-00001.jsonl.gz",
                pages[4:8] + [{"url": "https://docs.example.org/cookies.html", "html": BOILERPLATE_ONLY}])
    write_jsonl(root / "validation" / "pages.jsonl", pages[8:])
    return str(root)


def result_fields(result) -> dict:
    """A result without its path: what two runs into different folders must share."""
    fields = dict(vars(result))
    fields.pop("path")
    return fields


def claims(output: Path) -> list[str]:
    """The input files a fan-out claimed (with Ray and more than one worker)."""
    return sorted(p.name.removesuffix(".claim") for p in (output / "_work" / "extracted").glob("*.claim"))


# --- tests --------------------------------------------------------------------------------------


def test_main_content_keeps_the_documentation_and_drops_the_boilerplate(site, tmp_path):
    result = html_to_text(str(tmp_path / "out"), site, target_shard_bytes=5_000)
    rows = documents(str(tmp_path / "out"), COLUMNS)
    boilerplate_bytes = len(BOILERPLATE_ONLY.encode())
    assert result.documents_in == len(MODULES) + 1 and result.documents_out == len(MODULES) == len(rows)
    assert result.removed == {NO_MAIN_CONTENT: Removed(1, boilerplate_bytes, 0)}
    assert result.extractor.startswith("resiliparse ") and result.main_content
    assert set(result.splits) == {"train", "validation"} and result.splits["train"].documents == 8
    shards = list_shards("test", str(tmp_path / "out"))
    assert result.splits["train"].shards == len([s for s in shards if s.split == "train"]) >= 4
    for shard in shards:  # cut by target_shard_bytes, never across input files
        assert len({s.rsplit(":", 1)[0] for s in pq.read_table(shard.path).column("source").to_pylist()}) == 1
    assert result.bytes_out == sum(len(r["text"].encode()) for r in rows) < result.bytes_in

    expected_sources = ([f"train/pages-00000.jsonl.gz:{n}" for n in range(1, 5)]
                        + [f"train/pages-00001.jsonl.gz:{n}" for n in range(1, 5)]
                        + [f"validation/pages.jsonl:{n}" for n in range(1, 3)])
    assert [r["source"] for r in rows] == expected_sources
    assert [r["url"] for r in rows] == [f"https://docs.example.org/{m}.html" for m in MODULES]
    for module, row in zip(MODULES, rows, strict=True):
        assert row["id"] == document_id(row["text"])
        text = plain(row["text"])
        assert summary(module) in text, module
        assert not [s for s in NAVIGATION + CODE if s in text], module
    textwrap = plain(rows[0]["text"])
    assert "Object for wrapping/filling text." in textwrap and "Wrap a single paragraph of text" in textwrap

    # Without main-content extraction the site's navigation stays (scripts and styles never do),
    # and the all-boilerplate page is no longer empty.
    everything = html_to_text(str(tmp_path / "all"), site, main_content=False)
    texts = [plain(r["text"]) for r in documents(str(tmp_path / "all"))]
    assert everything.documents_out == len(MODULES) + 1 and everything.removed == {}
    assert all("Privacy policy" in t and "We use cookies" in t and "Downloads" in t for t in texts)
    assert not [s for t in texts for s in CODE if s in t]

    pages = [documentation_page(m) for m in MODULES]
    size = sum(len(p.encode()) for p in pages)
    for main_content in (True, False):
        started = time.perf_counter()
        for page in pages * 3:
            extract_text(page, main_content)
        elapsed = time.perf_counter() - started
        print(f"\nextraction (main_content={main_content}): {3 * size / 1e6:.2f} MB of HTML in {elapsed:.3f} s,"
              f" {3 * size / 1e6 / elapsed:.1f} MB/s per core")


def test_parquet_pages_keep_their_url_column_and_saved_pages_read_one_per_file(tmp_path):
    import pyarrow as pa

    raw = tmp_path / "parquet"
    (raw / "train").mkdir(parents=True)
    (raw / "validation").mkdir()
    urls = [f"https://docs.example.org/{m}.html" for m in MODULES[:3]]
    pq.write_table(pa.table({"url": urls, "html": [documentation_page(m) for m in MODULES[:3]]}),
                   raw / "train" / "pages.parquet", row_group_size=2)
    pq.write_table(pa.table({"html": [documentation_page(MODULES[3])]}), raw / "validation" / "pages.parquet")
    html_to_text(str(tmp_path / "out"), str(raw))
    rows = documents(str(tmp_path / "out"), COLUMNS)
    assert [(r["source"], r["url"]) for r in rows] == [("train/pages.parquet:1", urls[0]),
                                                        ("train/pages.parquet:2", urls[1]),
                                                        ("train/pages.parquet:3", urls[2]),
                                                        ("validation/pages.parquet:1", None)]
    assert [summary(m) in plain(r["text"]) for m, r in zip(MODULES, rows, strict=False)] == [True] * 4

    saved = tmp_path / "saved"
    (saved / "train").mkdir(parents=True)
    for module in MODULES[4:6]:
        (saved / "train" / f"{module}.html").write_text(documentation_page(module))
    result = html_to_text(str(tmp_path / "saved-out"), str(saved), text_format="text-file")
    rows = documents(str(tmp_path / "saved-out"), COLUMNS)
    assert [(r["source"], r["url"]) for r in rows] == [(f"train/{m}.html:1", None) for m in sorted(MODULES[4:6])]
    assert result.documents_out == 2 and all(r["id"] == document_id(r["text"]) for r in rows)


BROKEN_CHUNKS = b"zz\r\n<html><body><p>never read</p></body></html>\r\n0\r\n\r\n"
"""A chunked body whose first chunk size is not hexadecimal: it does not decode."""


def crawl(root: Path) -> list[tuple[str, str, str, str | None]]:
    """WARC files directly in `root` (no split layout); the pages they hold: (source, url, module, a
    sentence in a charset other than ASCII, or None)."""
    latin = "<p>Au menu du café : crème brûlée à la française, servie dans une façade naïve.</p>"
    cyrillic = "<p>Привет, мир: это страница в кодировке Windows-1251.</p>"
    greek = "<p>Καλημέρα κόσμε, η σελίδα δηλώνει την κωδικοποίησή της μόνο στο meta.</p>"
    umlaut = "<p>Grüße aus Zürich, komprimiert und in Stücken übertragen.</p>"
    records = [
        warcinfo(),                                                                                  # 1
        request("https://docs.example.org/textwrap.html"),                                           # 2
        response("https://docs.example.org/textwrap.html", documentation_page("textwrap").encode()),  # 3
        response("https://docs.example.org/heapq.html",  # the header names the charset; the meta lies
                 documentation_page("heapq", latin).encode("latin-1"), "text/html; charset=ISO-8859-1"),  # 4
        response("https://ru.example.org/shlex.html", documentation_page("shlex", cyrillic).encode("cp1251"),
                 "text/html; charset=windows-1251"),                                                 # 5
        response("https://el.example.org/fnmatch.html",  # no charset in the header: found in the meta tag
                 documentation_page("fnmatch", greek).replace('<meta charset="utf-8">', '<meta charset="iso-8859-7">')
                 .encode("iso-8859-7"), "text/html"),                                                # 6
        response("https://docs.example.org/logo.png", b"\x89PNG\r\n\x1a\n" + bytes(64), "image/png"),  # 7
        response("https://docs.example.org/old", b"<html><body><p>Moved here.</p></body></html>", "text/html",
                 "301 Moved Permanently", Location="/new"),                                          # 8
        response("https://docs.example.org/cookies.html", BOILERPLATE_ONLY.encode()),                # 9
        response("https://de.example.org/bisect.html",
                 chunked(gzip.compress(documentation_page("bisect", umlaut).encode())),
                 Content_Encoding="gzip", Transfer_Encoding="chunked"),                              # 10
        response("https://docs.example.org/tracked.html", documentation_page("string").encode(),  # 11
                 Set_Cookie="session=" + "0" * 70_000),  # an HTTP header longer than fastwarc reads
        response("https://docs.example.org/broken.html", BROKEN_CHUNKS, Transfer_Encoding="chunked"),  # 12
    ]
    (root / "crawl-00000.warc.gz").write_bytes(warc_gz(records))
    second = [request("https://docs.example.org/colorsys.html"),
              response("https://docs.example.org/colorsys.html", documentation_page("colorsys").encode())]
    (root / "crawl-00001.warc").write_bytes(b"".join(second))
    return [("crawl-00000.warc.gz:record 3", "https://docs.example.org/textwrap.html", "textwrap", None),
            ("crawl-00000.warc.gz:record 4", "https://docs.example.org/heapq.html", "heapq", strip_p(latin)),
            ("crawl-00000.warc.gz:record 5", "https://ru.example.org/shlex.html", "shlex", strip_p(cyrillic)),
            ("crawl-00000.warc.gz:record 6", "https://el.example.org/fnmatch.html", "fnmatch", strip_p(greek)),
            ("crawl-00000.warc.gz:record 10", "https://de.example.org/bisect.html", "bisect", strip_p(umlaut)),
            ("crawl-00001.warc:record 2", "https://docs.example.org/colorsys.html", "colorsys", None)]


def strip_p(html: str) -> str:
    return html.removeprefix("<p>").removesuffix("</p>")


def test_warc_responses_become_pages_with_their_urls_and_charsets(tmp_path):
    raw = tmp_path / "crawl"
    raw.mkdir()
    pages = crawl(raw)
    result = html_to_text(str(tmp_path / "out"), str(raw))
    rows = documents(str(tmp_path / "out"), COLUMNS)
    assert [(r["source"], r["url"]) for r in rows] == [(source, url) for source, url, _, _ in pages]
    for row, (_, _, module, sentence) in zip(rows, pages, strict=True):
        text = plain(row["text"])
        assert row["id"] == document_id(row["text"])
        assert summary(module) in text and not [s for s in NAVIGATION + CODE if s in text], module
        if sentence is not None:
            assert sentence in text, module
        assert not {"Ã", "Ð", "Ï", "\ufffd"} & set(text), module  # no mojibake, nothing undecodable
    assert result.splits["train"].documents == 6 and list(result.splits) == ["train"]
    assert result.documents_in == 8 and result.documents_out == 6
    assert result.removed == {NO_MAIN_CONTENT: Removed(1, len(BOILERPLATE_ONLY.encode()), 0),
                              UNDECODABLE: Removed(1, len(BROKEN_CHUNKS), 0)}
    assert result.counters == {"warc records": 14, "records not responses": 3, "responses not html": 1,
                               "responses not 2xx": 1, "responses with unreadable http headers": 1,
                               "charset from http header": 6, "charset detected": 1}


def test_a_killed_worker_resumes_with_the_files_it_finished(tmp_path):
    out, marker = tmp_path / "out", tmp_path / "stopped"
    blocked = [{"url": "https://docs.example.org/a.html", "html": documentation_page("textwrap")},
               {"url": "https://docs.example.org/b.html", "html": documentation_page("heapq")},
               {"url": "https://docs.example.org/c.html", "html": documentation_page("string") + "<!-- STOP -->"}]
    raw = tmp_path / "raw"
    write_jsonl(raw / "train" / "a.jsonl.gz", [{"url": f"u{i}", "html": documentation_page(m)}
                                               for i, m in enumerate(MODULES[:3])])
    write_jsonl(raw / "train" / "b.jsonl", blocked)
    code = f"""
import threading
from marin_assets.pipeline.curation import html_to_text as h
real = h.extract_text
def extract(html, main_content=True):
    if "<!-- STOP -->" in html:
        open({str(marker)!r}, "w").close()
        threading.Event().wait()  # stuck until killed
    return real(html, main_content)
h.extract_text = extract
h.html_to_text({str(out)!r}, {str(raw)!r}, target_shard_bytes=1000)
"""
    kill_when([sys.executable, "-c", code], str(marker), env=subprocess_env())
    first, second = work_path(str(out), "extracted", "train-00000.json"), work_path(str(out), "extracted",
                                                                                      "train-00001.json")
    assert os.path.exists(first) and not os.path.exists(second)
    assert os.path.exists(work_path(str(out), "files", "train-00001", "part-00001.parquet"))  # killed part-way
    assert not os.path.exists(out / "train")  # shards move into place only when every file is done
    finished = os.stat(first).st_mtime_ns

    resumed = html_to_text(str(out), str(raw), target_shard_bytes=1000)
    fresh = html_to_text(str(tmp_path / "fresh"), str(raw), target_shard_bytes=1000)
    assert os.stat(first).st_mtime_ns == finished  # the finished file was not extracted again
    assert result_fields(resumed) == result_fields(fresh) and resumed.documents_out == 6
    assert documents(str(out), COLUMNS) == documents(str(tmp_path / "fresh"), COLUMNS)
    assert resumed.splits["train"].shards == 6


def test_workers_on_ray_give_the_same_output(site, tmp_path, local_ray):
    serial = html_to_text(str(tmp_path / "serial"), site, target_shard_bytes=30_000)
    parallel = html_to_text(str(tmp_path / "ray"), site, target_shard_bytes=30_000, workers=2)
    assert result_fields(parallel) == result_fields(serial)
    assert documents(str(tmp_path / "ray"), COLUMNS) == documents(str(tmp_path / "serial"), COLUMNS)
    shards = sorted(str(p.relative_to(tmp_path / "ray")) for p in (tmp_path / "ray").glob("*/part-*.parquet"))
    assert shards == sorted(str(p.relative_to(tmp_path / "serial"))
                            for p in (tmp_path / "serial").glob("*/part-*.parquet"))
    # Two workers fanned out (claims are how they share the files); one is a plain loop.
    assert claims(tmp_path / "ray") == ["train-00000", "train-00001", "validation-00000"]
    assert claims(tmp_path / "serial") == []


def test_bad_input_names_the_file_and_the_line_or_record(tmp_path):
    page = documentation_page("colorsys")
    (tmp_path / "json" / "train").mkdir(parents=True)
    write_jsonl(tmp_path / "json" / "train" / "pages.jsonl.gz",
                [{"html": page, "url": "u1"}, {"text": page, "url": "u2"}])
    with pytest.raises(CurationError, match=r"html_to_text: .*pages\.jsonl\.gz, line 2: no 'html' field"
                                            r" \(fields: 'text', 'url'\)"):
        html_to_text(str(tmp_path / "out-json"), str(tmp_path / "json"))
    assert not os.path.exists(work_path(str(tmp_path / "out-json"), "extracted", "train-00000.json"))
    write_jsonl(tmp_path / "json" / "train" / "pages.jsonl.gz", [{"html": page}] * 40)
    data = (tmp_path / "json" / "train" / "pages.jsonl.gz").read_bytes()
    (tmp_path / "json" / "train" / "pages.jsonl.gz").write_bytes(data[:len(data) // 2])
    with pytest.raises(CurationError, match=r"html_to_text: .*pages\.jsonl\.gz, line \d+: corrupt or truncated gzip"
                                            r" data; .* \(the data stops mid-stream: the file is truncated\)"):
        html_to_text(str(tmp_path / "out-gzip"), str(tmp_path / "json"))

    records = [warcinfo(), request("https://a.example/"), response("https://a.example/", page.encode()),
               response("https://b.example/", page.encode())]
    whole = b"".join(records)
    cases = {
        # cut inside the fourth record's body: fewer bytes than its header declares
        "body.warc": (whole[:-500], r"body\.warc, record 4: truncated: its WARC header declares \d+ bytes of"
                                    r" content, the file holds \d+"),
        # cut inside the fourth record's header
        "header.warc": (b"".join(records[:3]) + records[3][:60],
                        r"header\.warc, record 4: its WARC header is incomplete \(no Content-Length\)"),
        # the last gzip member cut short
        "member.warc.gz": (warc_gz(records)[:-400], r"member\.warc\.gz, record 4: truncated: its WARC header"),
        # not a WARC record where the third should be
        "garbage.warc": (b"".join(records[:2]) + b"<html>not a record</html>\r\n\r\n" + b"".join(records[2:]),
                         r"garbage\.warc, record 3: not a readable WARC record \(.*\); records 1-2 were read"),
    }
    for name, (data, error) in cases.items():
        folder = tmp_path / name.split(".")[0]
        folder.mkdir()
        (folder / name).write_bytes(data)
        with pytest.raises(CurationError, match=r"html_to_text: .*" + error):
            html_to_text(str(tmp_path / f"out-{name}"), str(folder))


def test_the_step_materializes_and_its_output_feeds_the_tokenizer_and_tokenize(tmp_path, prefix):
    from marin_assets import Step, StepDefinitionError, load_result, materialize_step, read_record
    from marin_assets.pipeline.curation.html_to_text import HtmlToTextResult, html_to_text_step
    from marin_assets.pipeline.tokens.tokenize import tokenize_step
    from marin_assets.pipeline.tokens.tokenizer import bpe_tokenizer_step

    raw = tmp_path / "crawl"
    raw.mkdir()
    crawl(raw)
    dataset = Step(name="raw/crawl", fn=lambda out: None, override_output_path=str(raw))
    pages = html_to_text_step("curated/crawl-text", dataset)
    tokenizer = bpe_tokenizer_step("tokenizers/crawl-bpe", pages, vocab_size=300)
    tokenized = tokenize_step("tokenized/crawl", pages, tokenizer)
    for step in (dataset, pages, tokenizer, tokenized):
        materialize_step(step, prefix=prefix, settings=FAST)

    record = read_record(pages.output_path_under(prefix))
    assert record.result_type == "html_to_text_result" and record.result["documents_out"] == 6
    assert record.hash_attrs["extractor"].startswith("resiliparse ") and record.hash_attrs["main_content"] is True
    assert record.hash_attrs["stage"] == "html_to_text" and record.deps == [dataset.name_with_hash]
    result = load_result(pages.output_path_under(prefix))
    assert isinstance(result, HtmlToTextResult) and result.counters["responses not html"] == 1
    assert html_to_text_step("curated/crawl-text", dataset, main_content=False).hash != pages.hash
    with pytest.raises(StepDefinitionError, match="text_format must be one of auto, warc, jsonl, parquet"):
        html_to_text_step("curated/crawl-text", dataset, text_format="html")
    cache = read_record(tokenized.output_path_under(prefix)).result
    assert cache["splits"]["train"]["documents"] == 6 and cache["splits"]["train"]["tokens"] > 6 * 100
