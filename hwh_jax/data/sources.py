"""Document sources: local text files, TFDS datasets, pre-tokenised ArrayRecord files.

Text files: ``.txt``, ``.txt.gz``, ``.zip`` (every member), ``.jsonl`` (one document per line,
``text_field`` holds the text; ``.jsonl.gz`` too). Within a text file, a line holding only
``<|endoftext|>`` separates documents (the shipped Gutenberg corpus uses it); otherwise a file
(or zip member) is one document.
"""
from __future__ import annotations

import gzip
import io
import json
import zipfile
from pathlib import Path
from typing import Iterator

END_OF_TEXT = "<|endoftext|>"
TEXT_SUFFIXES = (".txt", ".txt.gz", ".zip", ".jsonl", ".jsonl.gz")


def _split_documents(text: str) -> Iterator[str]:
    doc = []
    for line in io.StringIO(text.replace("\r\n", "\n")):
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
        row = json.loads(line)
        if text_field not in row:
            raise KeyError(f"{where}:{n}: no field {text_field!r} (fields: {sorted(row)})")
        yield row[text_field]


def text_documents(path: Path, text_field: str = "text") -> Iterator[str]:
    """Documents of one local file, by suffix."""
    name = path.name
    if not path.exists():
        raise FileNotFoundError(f"data file not found: {path}")
    if name.endswith(".zip"):
        with zipfile.ZipFile(path) as z:
            for member in sorted(z.namelist()):
                if member.endswith("/"):
                    continue
                data = z.read(member).decode("utf-8", errors="replace")
                if member.endswith(".jsonl"):
                    yield from _jsonl_documents(data.splitlines(), text_field, f"{path}!{member}")
                else:
                    yield from _split_documents(data)
    elif name.endswith((".jsonl", ".jsonl.gz")):
        opener = gzip.open if name.endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8") as f:
            yield from _jsonl_documents(f, text_field, str(path))
    elif name.endswith((".txt", ".txt.gz")):
        opener = gzip.open if name.endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8", errors="replace") as f:
            yield from _split_documents(f.read())
    else:
        raise ValueError(f"unsupported data file {path}: expected one of {TEXT_SUFFIXES}")


def read_text(path: Path) -> str:
    """The whole text of a ``.txt`` / ``.txt.gz`` file, or of a ``.zip``'s members joined."""
    return "".join(text_documents(Path(path)))


def expand(paths: list[Path]) -> list[Path]:
    """Folders expand to the supported files inside them, sorted."""
    out = []
    for p in paths:
        if p.is_dir():
            found = sorted(f for f in p.rglob("*") if f.name.endswith(TEXT_SUFFIXES))
            if not found:
                raise FileNotFoundError(f"no {TEXT_SUFFIXES} files under {p}")
            out.extend(found)
        elif not p.exists():
            raise FileNotFoundError(f"data path not found: {p}")
        else:
            out.append(p)
    return out


def tfds_documents(name: str, split: str, *, data_dir: str | None = None,
                   text_field: str = "text") -> Iterator[str]:
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
