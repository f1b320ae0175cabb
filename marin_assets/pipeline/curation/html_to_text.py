"""html_to_text: web pages → the curated format (`shards`), each page's main content as plain text.

Input is documents with an HTML field (JSON lines plain or compressed, parquet: what `readers`
reads; a `url` field comes along), or WARC files (`.warc`, `.warc.gz`) of crawled pages. In a
WARC only HTTP responses with a 2xx status and an HTML content type are pages; every other record
(warcinfo, request, an image, a redirect) was never a document, so it is *counted* (`counters`),
not removed. A page's body is decoded with its HTTP header's charset, else the one detected (its
`<meta charset>`, else uchardet), mapped as browsers do (WHATWG: `iso-8859-1` reads as
windows-1252). That never fails (resiliparse falls back to UTF-8, then windows-1252): a mislabeled
page comes out garbled, not dropped, and the counters say how many charsets were guessed. What is
removed as `undecodable` is a page whose HTTP transfer or content coding does not undo (a broken
chunk, a corrupt brotli stream).

The text is resiliparse's extraction (Lexbor's DOM; with `main_content`, its heuristics drop
navigation, footers, banners and the like) with leading and trailing white space stripped; a page
with fewer than `min_chars` characters left is removed (`no main content`). Bytes in are HTML
bytes, bytes out text bytes. Layout, resumption and numbering are normalize's: one input file is
the unit of fan-out and of resumption, its shards numbered in input order once every file is done,
plus a `url` column (null where the input has none). `source` is `file:line` (`file:row` in
parquet) or `file:record N`, the Nth record of a WARC counting every record.
"""

from __future__ import annotations

import codecs
import contextlib
import functools
import importlib.metadata
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import fsspec
import orjson
import pyarrow as pa

from marin_assets.core.record_types import record_type
from marin_assets.core.step import Step, StepDefinitionError, made_by
from marin_assets.pipeline.curation.shards import CurationError, FileShardWriter, place_file_shards, work_path
from marin_assets.pipeline.curation.stage import (
    CurationResult,
    Removed,
    ShardStats,
    curation_step,
    placed,
    run_phase,
    summarize,
)
from marin_assets.pipeline.data import readers
from marin_assets.pipeline.data.readers import DatasetError
from marin_assets.pipeline.data.text_files import expand_files, find_splits

STAGE = "html_to_text"
NO_MAIN_CONTENT = "no main content"
UNDECODABLE = "undecodable"
URL_FIELD = "url"
WARC_SUFFIXES = (".warc", ".warc.gz")
FORMATS = ("auto", "warc", *readers.FORMATS[1:])
HTML_TYPES = ("text/html", "application/xhtml+xml")
EXTRACT_OPTIONS: dict[str, Any] = {"preserve_formatting": True, "list_bullets": True, "alt_texts": True,
                                   "links": False, "form_fields": False, "noscript": False, "comments": True,
                                   "post_meta": True, "hidden_elements": False}
"""resiliparse's `extract_plain_text` options besides `main_content`, spelled out (they enter identity):
paragraphs and list bullets kept, image alt texts kept, link targets and form fields left out."""
EXTRACTOR = f"resiliparse {importlib.metadata.version('resiliparse')}"
WARC_READER = f"fastwarc {importlib.metadata.version('fastwarc')}"
JSON_TYPES = {list: "array", str: "string", int: "number", float: "number", bool: "boolean", type(None): "null"}
HEAD_BYTES = 1 << 20
"""Bytes of a response read to learn its type and status (a longer HTTP header is unreadable)."""
SCHEMA = pa.schema([("id", pa.string()), ("text", pa.string()), ("source", pa.string()), ("url", pa.string())])

Page = tuple[int, str | None, str | None, int]
"""(line, row or record number; the HTML, or None when its HTTP body does not decode; its URL or None;
its size in bytes) of one input page."""


@record_type("html_to_text_result")
@dataclass(frozen=True)
class HtmlToTextResult(CurationResult):
    """A curation result that also names how the text was extracted."""

    extractor: str
    """`resiliparse 2.0.1`: the library (and version) whose extraction made the text."""
    main_content: bool
    """Only the main content was kept (navigation, footers and banners dropped)."""


def extract_text(html: str, main_content: bool = True) -> str:
    """The plain text of one HTML page, stripped (empty when nothing visible is left)."""
    from resiliparse.extract.html2text import extract_plain_text

    return extract_plain_text(html, main_content=main_content, **EXTRACT_OPTIONS).strip()


# --- reading pages ----------------------------------------------------------------------------


def format_of(file: str, text_format: str = "auto") -> str:
    """`warc` for WARC files (by suffix under "auto"), else the `readers` format of `file`."""
    if text_format not in FORMATS:
        raise ValueError(f"{STAGE}: text_format {text_format!r} is not one of {', '.join(FORMATS)}")
    if text_format == "warc" or (text_format == "auto" and file.lower().endswith(WARC_SUFFIXES)):
        return "warc"
    return readers.format_of(file, text_format)


def _pages(file: str, fmt: str, html_field: str, counters: dict[str, int]) -> Iterator[Page]:
    if fmt == "warc":
        return _warc_pages(file, counters)
    if fmt == "jsonl":
        return _json_pages(file, html_field)
    return _reader_pages(file, fmt, html_field)


def _json_pages(file: str, html_field: str) -> Iterator[Page]:
    """JSON lines with `html_field` (and `url` when there): read here, not by `readers`, to get both
    fields from one parse; errors as `readers` words them."""
    number = 0
    try:
        with readers.open_binary(file) as stream:
            for number, line in enumerate(stream, start=1):
                if line.isspace():
                    continue
                try:
                    record = orjson.loads(line[3:] if number == 1 and line.startswith(codecs.BOM_UTF8) else line)
                except orjson.JSONDecodeError as e:
                    raise CurationError(f"{STAGE}: {file}, line {number}: malformed JSON ({e.msg}"
                                        f" at column {e.colno})") from None
                if type(record) is not dict:
                    raise CurationError(f"{STAGE}: {file}, line {number}: a JSON {JSON_TYPES.get(type(record))},"
                                        " not an object (JSON lines hold one object per line)")
                html = record.get(html_field)
                if type(html) is not str:
                    fields = ", ".join(repr(k) for k in list(record)[:12]) or "none"
                    problem = (f"no {html_field!r} field (fields: {fields})" if html_field not in record
                               else f"{html_field!r} is {'null' if html is None else type(html).__name__}, not text")
                    raise CurationError(f"{STAGE}: {file}, line {number}: {problem}")
                url = record.get(URL_FIELD)
                if url is not None and type(url) is not str:
                    raise CurationError(f"{STAGE}: {file}, line {number}: {URL_FIELD!r} is {type(url).__name__},"
                                        " not text")
                yield number, html, url, len(html.encode("utf-8", "surrogatepass"))
    except readers.DECOMPRESSION_ERRORS as e:
        compression = readers.compression_of(file)
        if not compression or (isinstance(e, OSError) and "Invalid data stream" not in str(e)):  # bz2: OSError
            e.add_note(f"while reading {file} after line {number}")
            raise  # a real I/O error (a network failure) keeps its type
        read = f"lines 1-{number} were read" if number else "nothing could be read"
        raise CurationError(f"{STAGE}: {file}, line {number + 1}: corrupt or truncated {compression} data; {read}"
                            f" ({e})") from None


def _reader_pages(file: str, fmt: str, html_field: str) -> Iterator[Page]:
    """Parquet (its `url` column read alongside when there is one) or text files, through `readers`."""
    urls = _parquet_urls(file, html_field) if fmt == "parquet" else iter(())
    for _, number, html in readers.iter_documents([file], text_field=html_field, text_format=fmt):
        url = next(urls, None)
        if url is not None and type(url) is not str:
            raise CurationError(f"{STAGE}: {file}, row {number}: {URL_FIELD!r} is {type(url).__name__}, not text")
        yield number, html, url, len(html.encode("utf-8", "surrogatepass"))


def _parquet_urls(file: str, html_field: str) -> Iterator[Any]:
    """The `url` column of a parquet file, row by row (nothing when it has none). Opened at the first
    row, after `readers` has opened the file and named any problem with it."""
    import pyarrow.parquet as pq

    with fsspec.open(file, "rb") as f:
        parquet = pq.ParquetFile(f)
        if URL_FIELD not in parquet.schema_arrow.names or URL_FIELD == html_field:
            return
        for batch in parquet.iter_batches(columns=[URL_FIELD], batch_size=1024):
            yield from batch.column(0).to_pylist()


def _warc_pages(file: str, counters: dict[str, int]) -> Iterator[Page]:
    """The HTML pages of a WARC file; every record's length is checked against its header, so a
    truncated file is an error naming the record, not a quietly shorter dataset."""
    from fastwarc.warc import ArchiveIterator, WarcRecordType

    def count(name: str) -> None:
        counters[name] = counters.get(name, 0) + 1

    number = 0
    with fsspec.open(file, "rb") as stream:
        records = ArchiveIterator(stream, parse_http=False)
        while True:
            try:
                record = next(records, None)
            except OSError as e:
                raise CurationError(f"{STAGE}: {file}, record {number + 1}: not a readable WARC record ({e});"
                                    f" records 1-{number} were read") from None
            if record is None:
                return
            number += 1
            count("warc records")
            declared = record.headers.get("Content-Length")
            if declared is None or not declared.strip().isdigit():
                raise CurationError(f"{STAGE}: {file}, record {number}: its WARC header is incomplete (no"
                                    " Content-Length): the file is truncated or corrupt")
            if record.record_type != WarcRecordType.response:
                _check_length(file, number, int(declared), record.reader.consume())
                count("records not responses")
                continue
            head = record.reader.read(HEAD_BYTES)
            try:
                http = _http_message(head, decode=False)
            except OSError:  # an HTTP header past fastwarc's limit: not known to be a page
                http = None
                count("responses with unreadable http headers")
            status = http.http_headers.status_code if http is not None and http.http_headers is not None else None
            page = http is not None and record.is_http and http.http_content_type in HTML_TYPES
            if page and status is not None and 200 <= status < 300:
                block = head + record.reader.read()
                _check_length(file, number, int(declared), len(block))
            else:  # never held in memory whole: a video's record is as cheap as a redirect's
                _check_length(file, number, int(declared), len(head) + record.reader.consume())
                if http is not None:
                    count("responses not 2xx" if page else "responses not html")
                continue
            url = record.headers.get("WARC-Target-URI")
            url = url.strip("<>") if url else None
            try:
                body = _http_message(block, decode=True).reader.read()
            except OSError:  # a chunked or compressed body that does not decode: its stored size
                header_bytes = len(head) - http.content_length
                yield number, None, url, len(block) - header_bytes
                continue
            yield number, _decode(body, http.http_charset, counters), url, len(body)


def _http_message(block: bytes, decode: bool) -> Any:
    """A response record's block parsed as HTTP on its own (body decoded or not): a body that fails
    to decode inside fastwarc's iterator leaves the iterator unable to read the next record."""
    from fastwarc.warc import WarcRecord, WarcRecordType

    message = WarcRecord()
    message.init_headers(WarcRecordType.response)
    message.is_http = True
    message.set_bytes_content(block)
    message.parse_http(auto_decode="all" if decode else "none")
    return message


def _check_length(file: str, number: int, declared: int, found: int) -> None:
    if found != declared:
        raise CurationError(f"{STAGE}: {file}, record {number}: truncated: its WARC header declares {declared}"
                            f" bytes of content, the file holds {found}")


def _decode(body: bytes, charset: str | None, counters: dict[str, int]) -> str:
    """A page's body as text: the HTTP header's charset, else the detected one, as browsers map them."""
    from resiliparse.parse.encoding import bytes_to_str, detect_encoding, map_encoding_to_html5

    encoding = None
    if charset:
        with contextlib.suppress(LookupError):  # a label Python does not know: detect instead
            encoding = map_encoding_to_html5(codecs.lookup(charset).name)
    how = "charset from http header" if encoding else "charset detected"
    counters[how] = counters.get(how, 0) + 1
    return str(bytes_to_str(body, encoding or str(detect_encoding(body, from_html_meta=True))))


# --- one input file → shards --------------------------------------------------------------------


def _extract_file(dataset_path: str, output_path: str, html_field: str, text_format: str, main_content: bool,
                  min_chars: int, target_shard_bytes: int, item: tuple[str, int, str]) -> dict[str, Any]:
    """One input file → `_work/files/{split}-{n}/part-NNNNN.parquet`; its counts and shard count."""
    split, number, file = item
    relative = file[len(dataset_path):].lstrip("/") if file.startswith(dataset_path) else file
    writer = FileShardWriter(work_path(output_path, "files", f"{split}-{number:05d}"), target_shard_bytes, SCHEMA)
    fmt = format_of(file, text_format)
    where = {"warc": "record ", "parquet": "row "}.get(fmt, "line ")
    counters: dict[str, int] = {}
    documents_in = bytes_in = 0
    removed: dict[str, Removed] = {}
    try:
        for at, html, url, size in _pages(file, fmt, html_field, counters):
            documents_in += 1
            bytes_in += size
            if html is None:
                removed[UNDECODABLE] = removed.get(UNDECODABLE, Removed()) + Removed(1, size, 0)
                continue
            try:
                text = extract_text(html, main_content)
            except Exception as e:  # Lexbor refusing a page is rare; the page is named, not skipped
                raise CurationError(f"{STAGE}: {file}, {where}{at}: HTML extraction failed ({e})") from None
            if len(text) < min_chars:
                removed[NO_MAIN_CONTENT] = removed.get(NO_MAIN_CONTENT, Removed()) + Removed(1, size, 0)
                continue
            writer.add(text, f"{relative}:{where if fmt == 'warc' else ''}{at}", url)
    except DatasetError as e:
        raise CurationError(f"{STAGE}: {e}") from None
    writer.close()
    stats = ShardStats(split, documents_in, bytes_in, documents_in - sum(r.documents for r in removed.values()),
                       writer.bytes, dict(sorted(removed.items())), dict(sorted(counters.items())))
    return {"stats": stats.to_json(), "shards": writer.shards}


# --- the stage ----------------------------------------------------------------------------------


def find_inputs(dataset_path: str, splits: dict[str, list[str]] | None = None) -> dict[str, list[str]]:
    """`splits`, else the splits of the dataset's layout, else WARC files directly in it as `train`."""
    if splits:
        return dict(splits)
    try:
        return find_splits(dataset_path)
    except DatasetError as e:
        fs, base = fsspec.core.url_to_fs(dataset_path)
        if fs.isdir(base) and any(p.lower().endswith(WARC_SUFFIXES) for p in fs.ls(base, detail=False)):
            return {"train": [f"*{suffix}" for suffix in WARC_SUFFIXES]}
        raise CurationError(f"{STAGE}: {e}; nor are there WARC files ({', '.join(WARC_SUFFIXES)}) in it") from None


def html_to_text(output_path: str, dataset_path: str, splits: dict[str, list[str]] | None = None,
                 html_field: str = "html", text_format: str = "auto", main_content: bool = True, min_chars: int = 1,
                 target_shard_bytes: int = 64 << 20, workers: int = 1) -> HtmlToTextResult:
    """A dataset of HTML pages (`{split: [glob, …]}`, or found from its layout) as curated parquet shards of text."""
    if text_format not in FORMATS:
        raise ValueError(f"{STAGE}: text_format {text_format!r} is not one of {', '.join(FORMATS)}")
    if min_chars < 1:
        raise ValueError(f"{STAGE}: min_chars must be at least 1 (an empty text is never kept), got {min_chars}")
    try:
        items = [(split, n, file) for split, patterns in find_inputs(dataset_path, splits).items()
                 for n, file in enumerate(expand_files(dataset_path, patterns))]
    except DatasetError as e:
        raise CurationError(f"{STAGE}: {e}") from None
    outcomes = run_phase(output_path, "extracted", items,
                         functools.partial(_extract_file, dataset_path.rstrip("/"), output_path, html_field,
                                           text_format, main_content, min_chars, target_shard_bytes),
                         key_of=lambda item: f"{item[0]}-{item[1]:05d}", workers=workers,
                         name=f"{STAGE} {len(items)} files")
    folders = [work_path(output_path, "files", f"{split}-{number:05d}") for split, number, _ in items]
    counter = place_file_shards(output_path, [(item[0], folder, outcome["shards"]) for item, folder, outcome
                                              in zip(items, folders, outcomes, strict=True)])
    summary = summarize(STAGE, output_path, [ShardStats.from_json(o["stats"]) for o in outcomes])
    return HtmlToTextResult.of(placed(summary, counter), extractor=EXTRACTOR, main_content=main_content)


def html_to_text_step(name: str, dataset: Step, splits: dict[str, list[str]] | None = None, html_field: str = "html",
                      text_format: str = "auto", main_content: bool = True, workers: int = 1,
                      max_removed_fraction: float = 0.5, min_chars: int = 1,
                      target_shard_bytes: int = 64 << 20) -> Step:
    """`dataset`'s HTML pages (documents with `html_field`, or WARC files) as curated text shards.

    Identity: `html_field`, `splits`, `text_format`, `main_content`, `min_chars`, `target_shard_bytes`, the
    extractor and its options (and `dataset`); not `workers` nor `max_removed_fraction`.
    """
    if text_format not in FORMATS or min_chars < 1:
        raise StepDefinitionError(f"{STAGE} step {name!r}: text_format must be one of {', '.join(FORMATS)} (got"
                                  f" {text_format!r}) and min_chars at least 1 (got {min_chars})")
    chosen: Any = {k: list(v) for k, v in splits.items()} if splits is not None else "from-layout"
    return curation_step(
        name, STAGE,
        lambda out: html_to_text(out, dataset.output_path, splits, html_field, text_format, main_content, min_chars,
                                 target_shard_bytes, workers),
        dataset, {"extractor": EXTRACTOR, "warc_reader": WARC_READER, "main_content": main_content,
                  "extraction": EXTRACT_OPTIONS, "html_field": html_field, "splits": chosen,
                  "text_format": text_format, "min_chars": min_chars, "target_shard_bytes": target_shard_bytes,
                  "warc_pages": f"2xx responses of type {' or '.join(HTML_TYPES)}", "id": "xxh3-128"},
        description=made_by(html_to_text), max_removed_fraction=max_removed_fraction, cpu=1)
