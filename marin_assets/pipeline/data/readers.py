"""Documents from dataset files: JSON lines (plain, .gz, .zst, .bz2, .xz), parquet, plain text.

Streaming with bounded memory — a line, or one parquet record batch, at a time — so a 100 GB
shard costs no more memory than a small one, and through fsspec, so gs:// and other URLs read
like local paths. Every error names the file and the line or row at once: a bad shard is found
without reading the rest of the dataset, and never skipped silently.
"""

from __future__ import annotations

import bz2
import codecs
import contextlib
import io
import lzma
import os
import zlib
from collections.abc import Callable, Iterator, Sequence
from typing import IO, Any

import fsspec
import orjson
import zstandard

FORMATS = ("auto", "jsonl", "parquet", "text-file", "text-lines")
COMPRESSIONS = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd", ".bz2": "bz2", ".xz": "xz"}
JSON_SUFFIXES = (".jsonl", ".json", ".ndjson")
READ_BUFFER = 1 << 20

Batch = tuple[Sequence[int], list[str]]
"""Line or row numbers (1-based) and the texts of those documents."""


class DatasetError(ValueError):
    """The input data is malformed: bad JSON, a missing field, a corrupt file, no documents."""


def compression_of(file: str) -> str | None:
    """The compression a file's suffix names (`gzip`, `zstd`, `bz2`, `xz`), or None."""
    return COMPRESSIONS.get(os.path.splitext(file)[1].lower())


def format_of(file: str, text_format: str = "auto") -> str:
    """The format to read `file` as: `text_format` itself, or under "auto" the one its suffix names."""
    if text_format not in FORMATS:
        raise ValueError(f"text_format {text_format!r} is not one of {', '.join(FORMATS)}")
    if text_format != "auto":
        return text_format
    name = os.path.basename(file).lower()
    if compression_of(name):
        name = os.path.splitext(name)[0]
    if name.endswith(JSON_SUFFIXES):
        return "jsonl"
    if name.endswith(".parquet"):
        return "parquet"
    if name.endswith(".txt"):
        raise DatasetError(f"{file}: plain text; choose text_format='text-file' (one document per file)"
                           " or 'text-lines' (one document per non-empty line)")
    raise DatasetError(f"{file}: the name does not tell the format ({', '.join(JSON_SUFFIXES)}, .parquet,"
                       f" optionally {', '.join(COMPRESSIONS)}); choose text_format= one of {', '.join(FORMATS[1:])}")


def iter_text_batches(file: str, text_field: str = "text", text_format: str = "auto", batch_size: int = 1024,
                      skip: int = 0) -> Iterator[list[str]]:
    """The texts of `file`'s documents in lists of at most `batch_size`, after the first `skip`
    documents (a resumed tokenize skips what it already wrote; parquet skips whole row groups unread)."""
    for _, texts in _batches(file, text_field, text_format, batch_size, skip):
        yield texts


def iter_documents(files: Sequence[str], text_field: str = "text",
                   text_format: str = "auto") -> Iterator[tuple[str, int, str]]:
    """(file, line or row number, text) for every document of the files, in order."""
    for file in files:
        for numbers, texts in _batches(file, text_field, text_format, 1024, 0):
            for number, text in zip(numbers, texts, strict=True):
                yield file, number, text


def _batches(file: str, text_field: str, text_format: str, batch_size: int, skip: int) -> Iterator[Batch]:
    if batch_size < 1 or skip < 0:
        raise ValueError(f"batch_size must be positive and skip non-negative, got {batch_size} and {skip}")
    fmt = format_of(file, text_format)
    if fmt == "parquet":
        return _parquet(file, text_field, batch_size, skip)
    if fmt == "text-file":
        return _text_file(file, skip)
    return _lines(file, text_field, batch_size, skip, as_json=fmt == "jsonl")


# --- line formats ---------------------------------------------------------------------------


def _lines(file: str, text_field: str, batch_size: int, skip: int, as_json: bool) -> Iterator[Batch]:
    """JSON lines or text lines; blank lines are no documents (and skipping counts none)."""
    numbers: list[int] = []
    texts: list[str] = []
    number = 0
    loads = orjson.loads
    try:
        with open_binary(file) as stream:
            for number, line in enumerate(stream, start=1):
                if line.isspace():
                    continue
                if skip:
                    skip -= 1
                    continue
                if as_json:
                    try:
                        record = loads(line)
                    except orjson.JSONDecodeError as e:
                        record = _retry_without_bom(file, number, line, e)
                    text = record.get(text_field, _MISSING) if type(record) is dict else _NOT_AN_OBJECT
                    if type(text) is not str:
                        raise DatasetError(_bad_record(file, number, record, text_field)) from None
                else:
                    text = _decode(file, number, line.rstrip(b"\r\n"))
                numbers.append(number)
                texts.append(text)
                if len(texts) >= batch_size:
                    yield numbers, texts
                    numbers, texts = [], []
    except DECOMPRESSION_ERRORS as e:
        raise _unreadable(file, number, e) from None
    if texts:
        yield numbers, texts


_MISSING = object()
_NOT_AN_OBJECT = object()


def _retry_without_bom(file: str, number: int, line: bytes, error: orjson.JSONDecodeError) -> Any:
    """A UTF-8 byte order mark opening the file is allowed; anything else is a clear error."""
    if number == 1 and line.startswith(codecs.BOM_UTF8):
        with contextlib.suppress(orjson.JSONDecodeError):
            return orjson.loads(line[len(codecs.BOM_UTF8):])
    _decode(file, number, line)  # invalid UTF-8 is named as such, not as bad JSON
    raise DatasetError(f"{file}, line {number}: malformed JSON ({error.msg} at column {error.colno})") from None


def _bad_record(file: str, number: int, record: Any, text_field: str) -> str:
    where = f"{file}, line {number}"
    if type(record) is not dict:
        return f"{where}: a JSON {_json_type(record)}, not an object (JSON lines hold one object per line)"
    if text_field not in record:
        fields = ", ".join(repr(k) for k in list(record)[:12]) or "none"
        return f"{where}: no {text_field!r} field (fields: {fields})"
    return f"{where}: {text_field!r} is {_type_name(record[text_field])}, not text"


def _json_type(value: Any) -> str:
    names = {list: "array", str: "string", int: "number", float: "number", bool: "boolean", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _decode(file: str, number: int, line: bytes) -> str:
    """`line` as UTF-8; invalid bytes name the line and the byte within it."""
    try:
        return line.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DatasetError(f"{file}, line {number}: invalid UTF-8 at byte {e.start + 1} of the line"
                           f" ({line[e.start:e.end]!r}: {e.reason})") from None


def _text_file(file: str, skip: int) -> Iterator[Batch]:
    """The whole file is one document (none when it is blank)."""
    if skip:
        return
    try:
        with open_binary(file) as stream:
            data = stream.read()
    except DECOMPRESSION_ERRORS as e:
        raise _unreadable(file, 0, e) from None
    if data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8):]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line, line_start = data.count(b"\n", 0, e.start) + 1, data.rfind(b"\n", 0, e.start) + 1
        raise DatasetError(f"{file}, line {line}: invalid UTF-8 at byte {e.start - line_start + 1} of the line"
                           f" ({data[e.start:e.end]!r}: {e.reason})") from None
    if text.strip():
        yield [1], [text]


# --- parquet --------------------------------------------------------------------------------


def _parquet(file: str, text_field: str, batch_size: int, skip: int) -> Iterator[Batch]:
    """The text column only, a record batch at a time; skipped row groups are never decoded."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    from fsspec.implementations.local import LocalFileSystem

    fs, path = fsspec.core.url_to_fs(file)
    with contextlib.ExitStack() as stack:
        # Local files are read by Arrow itself (faster than through a Python file object).
        source = path if isinstance(fs, LocalFileSystem) else stack.enter_context(fs.open(path, "rb"))
        try:
            parquet = stack.enter_context(pq.ParquetFile(source))
        except (pa.ArrowException, OSError) as e:
            raise DatasetError(f"{file}: not a readable parquet file ({e})") from None
        schema = parquet.schema_arrow
        if text_field not in schema.names:
            raise DatasetError(f"{file}: no {text_field!r} column (columns: {', '.join(schema.names) or 'none'})")
        column_type = schema.field(text_field).type
        if not (pa.types.is_string(column_type) or pa.types.is_large_string(column_type)
                or pa.types.is_string_view(column_type)):
            raise DatasetError(f"{file}: column {text_field!r} is {column_type}, not text (string)")
        row = 1  # the 1-based number of the next row
        for group in range(parquet.num_row_groups):
            rows = parquet.metadata.row_group(group).num_rows
            if skip >= rows:
                skip, row = skip - rows, row + rows
                continue
            # One reader per row group: a batch never spans two, so an error names the group.
            batches = parquet.iter_batches(batch_size=batch_size, row_groups=[group], columns=[text_field])
            end = row + rows - 1
            while True:
                try:
                    batch = next(batches, None)
                except (pa.ArrowException, OSError) as e:
                    raise DatasetError(f"{file}, row {row}: unreadable parquet data (row group {group},"
                                       f" rows {end - rows + 1}-{end}: {e})") from None
                if batch is None:
                    break
                column = batch.column(0)
                if skip:
                    dropped = min(skip, len(column))
                    column, skip, row = column.slice(dropped), skip - dropped, row + dropped
                if column.null_count:
                    first_null = pc.index(column.is_null(), True).as_py()
                    raise DatasetError(f"{file}, row {row + first_null}: {text_field!r} is null, not text")
                if len(column):
                    yield range(row, row + len(column)), column.to_pylist()
                    row += len(column)


# --- records (structured fields) ------------------------------------------------------------


def iter_records(file: str, fields: Sequence[str], text_format: str = "auto",
                 batch_size: int = 256) -> Iterator[tuple[Sequence[int], list[dict[str, Any]]]]:
    """(line or row numbers, records) of a JSON lines or parquet file, in batches, for data whose fields are
    structured (chat turns) rather than text: a JSON line's whole object, or a parquet row's values in those of
    `fields` the file has (only those columns are read; a file with none of them is an error naming its
    columns). What the values mean is the caller's to check."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    fmt = format_of(file, text_format)
    if fmt == "parquet":
        return _parquet_records(file, fields, batch_size)
    if fmt != "jsonl":
        raise DatasetError(f"{file}: records are read from JSON lines or parquet, not {fmt}")
    return _json_records(file, batch_size)


def _json_records(file: str, batch_size: int) -> Iterator[tuple[list[int], list[dict[str, Any]]]]:
    numbers: list[int] = []
    records: list[dict[str, Any]] = []
    number = 0
    try:
        with open_binary(file) as stream:
            for number, line in enumerate(stream, start=1):
                if line.isspace():
                    continue
                try:
                    record = orjson.loads(line)
                except orjson.JSONDecodeError as e:
                    record = _retry_without_bom(file, number, line, e)
                if type(record) is not dict:
                    raise DatasetError(f"{file}, line {number}: a JSON {_json_type(record)}, not an object (JSON"
                                       " lines hold one object per line)")
                numbers.append(number)
                records.append(record)
                if len(records) >= batch_size:
                    yield numbers, records
                    numbers, records = [], []
    except DECOMPRESSION_ERRORS as e:
        raise _unreadable(file, number, e) from None
    if records:
        yield numbers, records


def _parquet_records(file: str, fields: Sequence[str], batch_size: int) -> Iterator[tuple[range, list[dict]]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    fs, path = fsspec.core.url_to_fs(file)
    row = 1  # the 1-based number of the next row
    try:
        with fs.open(path, "rb") as source, pq.ParquetFile(source) as parquet:
            names = parquet.schema_arrow.names
            columns = [f for f in fields if f in names]
            if not columns:
                wanted = " or ".join(repr(f) for f in fields)
                raise DatasetError(f"{file}: no {wanted} column (columns: {', '.join(names) or 'none'})")
            for batch in parquet.iter_batches(batch_size=batch_size, columns=columns):
                values = [batch.column(c).to_pylist() for c in columns]
                yield range(row, row + batch.num_rows), [dict(zip(columns, row_values, strict=True))
                                                         for row_values in zip(*values, strict=True)]
                row += batch.num_rows
    except (pa.ArrowException, OSError) as e:
        if row == 1:
            raise DatasetError(f"{file}: not a readable parquet file ({e})") from None
        raise DatasetError(f"{file}, row {row}: unreadable parquet data ({e})") from None


# --- opening, decompressing -----------------------------------------------------------------


@contextlib.contextmanager
def open_binary(file: str) -> Iterator[IO[bytes]]:
    """`file` opened for reading bytes, decompressed by its suffix, streaming."""
    compression = compression_of(file)
    with fsspec.open(file, "rb") as raw:
        if compression is None:
            yield raw
            return
        with io.BufferedReader(DecompressingReader(raw, DECODERS[compression]), READ_BUFFER) as stream:
            yield stream


DECODERS: dict[str, Callable[[], Any]] = {
    "gzip": lambda: zlib.decompressobj(wbits=31),  # one gzip member, its CRC checked
    "bz2": bz2.BZ2Decompressor,
    "xz": lzma.LZMADecompressor,
    "zstd": lambda: zstandard.ZstdDecompressor().decompressobj(),
}


class DecompressingReader(io.RawIOBase):
    """A compressed stream as a raw file, member (or frame) after member. Unlike zstandard's
    stream reader (which fsspec uses), a file that stops inside a member is an error, not a quiet
    end; and it is faster than `gzip.GzipFile`, which refills in 8 KiB steps. Memory: the output
    of one `chunk` of input."""

    def __init__(self, source: IO[bytes], new_decoder: Callable[[], Any], chunk: int = 1 << 16) -> None:
        self._source = source
        self._new_decoder = new_decoder
        self._chunk = chunk
        self._decoder = new_decoder()
        self._fed = False  # the current member has had input
        self._pending = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._pending:
            data = self._source.read(self._chunk)
            if not data:
                if self._fed and not self._decoder.eof:
                    raise EOFError("the data stops mid-stream: the file is truncated")
                return 0
            self._pending = memoryview(self._feed(data))
        n = min(len(buffer), len(self._pending))
        buffer[:n] = self._pending[:n]
        self._pending = self._pending[n:]
        return n

    def _feed(self, data: bytes) -> bytes:
        out = []
        while data:
            if self._decoder.eof:  # the next member, after any zero padding (gzip allows it)
                data = data.lstrip(b"\0")
                if not data:
                    break
                self._decoder = self._new_decoder()
            out.append(self._decoder.decompress(data))
            self._fed = True
            data = self._decoder.unused_data if self._decoder.eof else b""
        return b"".join(out)


DECOMPRESSION_ERRORS = (EOFError, zlib.error, zstandard.ZstdError, lzma.LZMAError, OSError)
"""What reading a compressed file raises: corrupt data (bz2 says OSError), or a real I/O error."""


def _unreadable(file: str, last_line: int, error: BaseException) -> BaseException:
    """A decompression failure as a DatasetError naming the line reached; other I/O errors
    (a network failure) keep their type, with a note naming the file."""
    compression = compression_of(file)
    corrupt = isinstance(error, EOFError | zlib.error | zstandard.ZstdError | lzma.LZMAError) or (
        compression == "bz2" and isinstance(error, OSError) and "Invalid data stream" in str(error))
    if compression and corrupt:
        read = f"lines 1-{last_line} were read" if last_line else "nothing could be read"
        return DatasetError(f"{file}, line {last_line + 1}: corrupt or truncated {compression} data; {read}"
                            f" ({error})")
    error.add_note(f"while reading {file} after line {last_line}")
    return error
