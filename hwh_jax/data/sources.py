"""Document sources: local text files, TFDS datasets, pre-tokenised ArrayRecord files.

Text files: ``.txt``, ``.txt.gz``, ``.zip`` (every member), ``.jsonl`` (one document per line,
``text_field`` holds the text; ``.jsonl.gz`` too), ``.parquet`` (the ``text_field`` column,
read row group by row group; needs pyarrow). Within a text file, a line holding only
``<|endoftext|>`` separates documents (the shipped Gutenberg corpus uses it); otherwise a file
(or zip member) is one document. Text must be UTF-8: invalid bytes stop the read with the file,
line and column with ``errors="strict"``, or are read as U+FFFD with a warning that counts them
(``"replace"``, the default: the shipped Dickens corpus has 8 such bytes); a file holding NUL
bytes is refused as not text.
"""

from __future__ import annotations

import gzip
import io
import json
import logging
import zipfile
from pathlib import Path
from typing import Iterator

from hwh_jax import storage
from hwh_jax.data.paths import ASSETS

log = logging.getLogger(__name__)
END_OF_TEXT = "<|endoftext|>"
TEXT_SUFFIXES = (".txt", ".txt.gz", ".zip", ".jsonl", ".jsonl.gz", ".parquet")
DECODE_ERRORS = ("strict", "replace")


_SAID: set = set()


def _replaced(where: str, count: int, line: int, col: int) -> None:
    """The warning that invalid bytes were read as U+FFFD: once a file and process (a run reads
    a corpus twice: for its tokenizer and for its shards). The shipped corpora's own repairs
    are known (the Dickens corpus' 8 CP437 bytes, assets/dickens/PROVENANCE.txt): DEBUG."""
    if where in _SAID:
        return
    _SAID.add(where)
    level = logging.DEBUG if where.startswith(str(ASSETS)) else logging.WARNING
    log.log(
        level,
        "%s: %d invalid UTF-8 byte sequence(s) read as U+FFFD, the first at line %d, "
        "column %d (data.decode_errors='strict' stops instead)",
        where,
        count,
        line,
        col,
    )


def decode(data: bytes, where: str, errors: str = "replace") -> str:
    """``data`` as UTF-8 text. A NUL byte (binary data, never text) raises ValueError naming
    ``where`` and the line. Invalid UTF-8 raises naming the line and column
    (``errors="strict"``), or is read as U+FFFD with a warning that counts the bytes and names
    the first line and column (``errors="replace"``): never silently."""
    nul = data.find(b"\x00")
    if nul >= 0:
        line = data.count(b"\n", 0, nul) + 1
        raise ValueError(
            f"{where}:{line}: not text (a NUL byte at offset {nul}: binary data); "
            f"remove it from data.paths"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        col = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        if errors == "strict":
            raise ValueError(
                f"{where}:{line}:{col}: invalid UTF-8 (byte 0x{data[e.start]:02x}); "
                f"fix the file, or set data.decode_errors='replace' to read such "
                f"bytes as U+FFFD"
            ) from None
        text = data.decode("utf-8", errors="replace")
        _replaced(
            where,
            text.count("\ufffd") - data.decode("utf-8", errors="ignore").count("\ufffd"),
            line,
            col,
        )
        return text


def _split_documents(text: str) -> Iterator[str]:
    yield from _split_lines(io.StringIO(text.replace("\r\n", "\n")))


def _decoded_lines(f, where: str, errors: str) -> Iterator[str]:
    """A binary file's lines as text (CRLF as LF), with ``decode``'s checks line by line: a NUL
    byte refused, invalid UTF-8 stopping (``strict``) or replaced and counted in one warning."""
    replaced, first = 0, None
    for n, raw in enumerate(f, 1):
        nul = raw.find(b"\x00")
        if nul >= 0:
            raise ValueError(
                f"{where}:{n}: not text (a NUL byte at column {nul + 1}: binary "
                f"data); remove it from data.paths"
            )
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            if errors == "strict":
                raise ValueError(
                    f"{where}:{n}:{e.start + 1}: invalid UTF-8 (byte "
                    f"0x{raw[e.start]:02x}); fix the file, or set "
                    f"data.decode_errors='replace' to read such bytes as U+FFFD"
                ) from None
            line = raw.decode("utf-8", errors="replace")
            replaced += line.count("\ufffd") - raw.decode("utf-8", "ignore").count("\ufffd")
            first = first or (n, e.start + 1)
        yield line[:-2] + "\n" if line.endswith("\r\n") else line
    if replaced:
        _replaced(where, replaced, *first)


def _split_lines(lines) -> Iterator[str]:
    """Documents of a text file's lines: a line holding only <|endoftext|> separates them."""
    doc = []
    for line in lines:
        if line.strip() == END_OF_TEXT:
            if doc:
                yield "".join(doc)
            doc = []
        else:
            doc.append(line)
    if doc and "".join(doc).strip():
        yield "".join(doc)


def _jsonl_documents(lines, text_field: str, where: str) -> Iterator[str]:
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(
                f"{where}:{n}: not a JSON object ({e.msg}, column {e.colno})"
            ) from None
        if not isinstance(row, dict) or text_field not in row:
            fields = sorted(row) if isinstance(row, dict) else type(row).__name__
            raise KeyError(
                f"{where}:{n}: no field {text_field!r} (fields: {fields}); set data.text_field"
            )
        yield row[text_field]


def text_documents(path: Path, text_field: str = "text", errors: str = "replace") -> Iterator[str]:
    """Documents of one local file, by suffix (module docstring)."""
    name = path.name
    if not path.exists():
        raise FileNotFoundError(f"data file not found: {path}")
    if name.endswith(".zip"):
        with zipfile.ZipFile(path) as z:
            for member in sorted(z.namelist()):
                if member.endswith("/"):
                    continue
                where = f"{path}!{member}"
                data = decode(z.read(member), where, errors)
                if member.endswith(".jsonl"):
                    yield from _jsonl_documents(data.splitlines(), text_field, where)
                else:
                    yield from _split_documents(data)
    elif name.endswith((".jsonl", ".jsonl.gz", ".txt", ".txt.gz")):
        opener = gzip.open if name.endswith(".gz") else open
        with opener(path, "rb") as f:  # line by line: any size of file
            lines = _decoded_lines(f, str(path), errors)
            if name.endswith((".jsonl", ".jsonl.gz")):
                yield from _jsonl_documents(lines, text_field, str(path))
            else:
                yield from _split_lines(lines)
    elif name.endswith(".parquet"):
        yield from _parquet_documents(path, text_field)
    else:
        raise ValueError(f"unsupported data file {path}: expected one of {TEXT_SUFFIXES}")


def _parquet_documents(path: Path, text_field: str) -> Iterator[str]:
    """The ``text_field`` column of a Parquet file, row group by row group (pyarrow)."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ImportError(f"{path}: reading Parquet needs pyarrow (pip install pyarrow)") from None
    table = pq.ParquetFile(path)
    if text_field not in table.schema_arrow.names:
        raise KeyError(
            f"{path}: no column {text_field!r} (columns: {table.schema_arrow.names}); "
            f"set data.text_field"
        )
    for batch in table.iter_batches(columns=[text_field], batch_size=4096):
        yield from (t for t in batch.column(0).to_pylist() if t is not None)


def read_text(path: Path) -> str:
    """The whole text of a ``.txt`` / ``.txt.gz`` file, or of a ``.zip``'s members joined."""
    return "".join(text_documents(storage.local_copy(path)))


def expand(paths: list) -> list[Path]:
    """Folders expand to the supported files inside them, sorted. A bucket's files are copied
    to the local cache (once) and the copies returned; a bucket folder expands to the files
    directly inside it."""
    out = []
    for p in paths:
        if storage.is_remote(p):
            p = storage.path(p)
            found = (
                sorted(f for f in p.glob("*") if f.name.endswith(TEXT_SUFFIXES))
                if p.is_dir()
                else [p]
                if p.exists()
                else []
            )
            if not found:
                raise FileNotFoundError(f"no {TEXT_SUFFIXES} files at {p}")
            out.extend(storage.local_copy(f) for f in found)
        elif p.is_dir():
            found = sorted(f for f in p.rglob("*") if f.name.endswith(TEXT_SUFFIXES))
            if not found:
                raise FileNotFoundError(f"no {TEXT_SUFFIXES} files under {p}")
            out.extend(found)
        elif not p.exists():
            raise FileNotFoundError(f"data path not found: {p}")
        else:
            out.append(p)
    return out


def tfds_documents(
    name: str, split: str, *, data_dir: str | None = None, text_field: str = "text"
) -> Iterator[str]:
    """Documents of a TFDS dataset read through ``tfds.data_source`` (random access, no TF
    graph): the route to FineWeb-Edu, C4 etc. on hosts that have them prepared."""
    import tensorflow_datasets as tfds

    source = tfds.data_source(name, split=split, data_dir=data_dir, download=False)
    for i in range(len(source)):
        text = source[i][text_field]
        yield text.decode("utf-8") if isinstance(text, bytes) else str(text)


def arrayrecord_tokens(paths: list[Path]) -> Iterator:
    """Pre-tokenised documents: each ArrayRecord record is one document's token ids as
    little-endian uint32 bytes (``write_arrayrecord_tokens`` writes this format)."""
    import numpy as np
    from array_record.python.array_record_data_source import ArrayRecordDataSource

    for p in paths:
        if not p.exists():
            raise FileNotFoundError(f"ArrayRecord file not found: {p}")
    source = ArrayRecordDataSource([str(p) for p in paths])
    for i in range(len(source)):
        yield np.frombuffer(source[i], dtype="<u4").astype(np.int64)


def write_arrayrecord_tokens(path: Path, documents) -> None:
    """Write token-id documents (iterables of ints) as one ArrayRecord file."""
    import numpy as np
    from array_record.python.array_record_module import ArrayRecordWriter

    writer = ArrayRecordWriter(str(path), "group_size:1")
    for doc in documents:
        writer.write(np.asarray(doc, dtype="<u4").tobytes())
    writer.close()
