"""Token shards: a corpus tokenised once, in parallel, into ArrayRecord files that training reads
lazily as one token stream.

A prepared folder holds

  manifest.json            the tokenizer (name, vocabulary, EOS, SHA-256 of its files), the
                           source, the date, the documents and tokens, the shards (each with
                           its blocks, bytes and SHA-256), ``complete``
  tokens-NNNNN.array_record  consecutive blocks of ``block`` uint32 (little-endian) tokens of the
                           stream, one block a record; a file is closed after the chunk of
                           documents that brings it to ``shard_blocks`` blocks
  counts.npy               the stream's token-id histogram (the unigram entropy without a pass)
  progress.json            while preparing: what the finished shards hold (resume point)

The stream is every document's ids followed by EOS, in input order: exactly what
``packing.concat_documents`` builds in memory, so a run reads the same windows from either.
``prepare`` tokenises documents in chunks on a pool of worker processes (in order), writes a
shard at a time and records after each one where it is, so a stopped preparation resumes from
its last finished shard; processes preparing the same folder at once wait for the first (a
lock file beside it). ``TokenStream`` reads any token range by the blocks it spans, opening
the files lazily in each process that reads them (Grain's workers included); its memory does not
grow with the corpus.

The folder may be a bucket URL (``hwh_jax.storage``). ArrayRecord's reader and writer open
local files only, so ``prepare`` writes into a local staging folder and uploads the finished
files (shards first, ``manifest.json`` last, so a reader never sees a manifest without its
shards), and ``TokenStream`` copies a shard to the local cache the first time it reads from it
(checked against the size the manifest records). Or mount the bucket (gcsfuse) and give the
mounted path.

A shard is checked before its bytes reach ArrayRecord's native reader (which a damaged record
can crash): every shard's size when a run opens a local folder, its SHA-256 the first time a
process reads it (``verified_shard``: a few seconds a GB); a mismatch ends with one line
naming the shard and how to rebuild it. Folders prepared before the hashes were recorded are
checked by size only.
"""

from __future__ import annotations

import collections
import datetime
import fcntl
import hashlib
import io
import json
import logging
import multiprocessing
import os
import shutil
import time
from pathlib import Path

import numpy as np

from hwh_jax import storage
from hwh_jax.data.tokenizers import bpe_file

log = logging.getLogger(__name__)
BLOCK = 65536  # tokens a record
SHARD_BLOCKS = 2048  # records a file: 134M tokens, 512 MiB
CHUNK_CHARS = 4 << 20  # characters of text a worker tokenises at a time


def _shard_name(i: int) -> str:
    return f"tokens-{i:05d}.array_record"


class TokenStream:
    """The prepared stream of ``folder`` (tokens [start, stop)) as a read-only 1-D array:
    ``len()``, ``stream[a:b]`` (an np.ndarray of those tokens, read from their blocks),
    ``view(a, b)`` (a TokenStream of a sub-range) and ``np.asarray(stream)`` (all of it)."""

    def __init__(self, folder: storage.PathLike, start: int = 0, stop: int | None = None):
        self.folder = storage.path(folder)
        self.manifest = read_manifest(self.folder)
        total = int(self.manifest["tokens"])
        self.start, self.stop = start, total if stop is None else stop
        if not 0 <= self.start <= self.stop <= total:
            raise ValueError(f"TokenStream range [{start}, {stop}) outside [0, {total})")
        self.block = int(self.manifest["block"])
        self.dtype = np.dtype(np.uint32)
        self._first_block = np.cumsum([0] + [s["blocks"] for s in self.manifest["shards"]])
        self._sources = {}
        if not storage.is_remote(self.folder):  # sizes: cheap, at once (a bucket's: on copy)
            for shard in self.manifest["shards"]:
                _check_size(
                    self.folder,
                    shard,
                    (self.folder / shard["file"]).stat().st_size
                    if (self.folder / shard["file"]).exists()
                    else -1,
                )

    def __getstate__(self):  # readers are reopened in each process
        return {k: v for k, v in self.__dict__.items() if k != "_sources"}

    def __setstate__(self, state):
        self.__dict__.update(state, _sources={})

    def _record(self, r: int) -> bytes:
        """Block ``r`` of the stream, from the shard that holds it (opened on first use, after
        its bytes are checked against the manifest: ``verified_shard``; a bucket's shard
        copied to the local cache first)."""
        i = int(np.searchsorted(self._first_block, r, side="right")) - 1
        source = self._sources.get(i)
        if source is None:
            from array_record.python.array_record_data_source import ArrayRecordDataSource

            local = verified_shard(self.folder, self.manifest["shards"][i])
            source = self._sources[i] = ArrayRecordDataSource([str(local)])
        return source[r - int(self._first_block[i])]

    def __len__(self) -> int:
        return self.stop - self.start

    @property
    def shape(self):
        return (len(self),)

    def view(self, start: int, stop: int) -> "TokenStream":
        return TokenStream(self.folder, self.start + start, self.start + stop)

    def __getitem__(self, key) -> np.ndarray:
        if isinstance(key, (int, np.integer)):
            i = int(key) + (len(self) if key < 0 else 0)
            if not 0 <= i < len(self):
                raise IndexError(f"token {key} outside a stream of {len(self)}")
            return self[i : i + 1][0]
        if not isinstance(key, slice) or key.step not in (None, 1):
            raise TypeError("TokenStream takes an index or a contiguous slice (stream[a:b])")
        a, b, _ = key.indices(len(self))
        if b <= a:
            return np.zeros((0,), np.uint32)
        a, b = a + self.start, b + self.start
        first, last = a // self.block, (b - 1) // self.block
        blocks = [np.frombuffer(self._record(r), dtype="<u4") for r in range(first, last + 1)]
        data = np.concatenate(blocks) if len(blocks) > 1 else blocks[0]
        return data[a - first * self.block : b - first * self.block].astype(np.uint32)

    def __iter__(self):
        step = self.block * 16
        for a in range(0, len(self), step):
            yield from self[a : a + step]

    def __array__(self, dtype=None, copy=None):
        out = self[0 : len(self)]
        return out if dtype is None else out.astype(dtype)

    def counts(self) -> np.ndarray:
        """Token-id histogram of this range (the whole stream's from counts.npy, less what
        lies outside the range, read from its blocks)."""
        counts = np.load(io.BytesIO((self.folder / "counts.npy").read_bytes())).astype(np.int64)
        total = int(self.manifest["tokens"])
        for a, b in ((0, self.start), (self.stop, total)):
            for lo in range(a, b, 1 << 24):
                outside = TokenStream(self.folder, lo, min(b, lo + (1 << 24)))
                np.subtract.at(counts, np.asarray(outside).astype(np.int64), 1)
        return counts

    def __repr__(self):
        return f"TokenStream({self.folder}, tokens {self.start}..{self.stop})"


class ShardDamaged(ValueError):
    """A token shard whose bytes are not those its manifest records."""


_VERIFIED: set = set()  # (path, size, mtime) of shards hashed in this process


def _damaged(folder, shard: dict, what: str) -> ShardDamaged:
    return ShardDamaged(
        f"token shard {storage.path(folder) / shard['file']} is damaged ({what}); "
        f"its records cannot be trusted. Delete {folder} and prepare it again "
        f"with python -m launch.prepare_data (or restore the shard from a copy)"
    )


def _check_size(folder, shard: dict, got: int) -> None:
    want = shard.get("bytes")
    if got < 0:
        raise _damaged(folder, shard, "missing")
    if want is not None and got != want:
        raise _damaged(
            folder,
            shard,
            f"{got:,} bytes where its manifest records {want:,}: truncated or replaced",
        )


def file_sha256(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def verified_shard(folder, shard: dict) -> Path:
    """The local file of ``shard`` once its size and (where the manifest records it, once a
    process) SHA-256 match the manifest; ``ShardDamaged`` naming the shard and the remedy
    otherwise. The check comes before ArrayRecord's native reader sees the bytes: a damaged
    record can crash that reader (a segfault), not raise."""
    try:
        local = storage.local_copy(
            storage.path(folder) / shard["file"], expected_size=shard.get("bytes")
        )
    except OSError as e:
        raise _damaged(folder, shard, str(e)) from None
    stat = local.stat() if local.exists() else None
    _check_size(folder, shard, stat.st_size if stat else -1)
    key = (str(local), stat.st_size, stat.st_mtime_ns)
    if shard.get("sha256") and key not in _VERIFIED:
        if file_sha256(local) != shard["sha256"]:
            raise _damaged(folder, shard, "its SHA-256 differs from the manifest's: bytes changed")
        _VERIFIED.add(key)
    return local


def read_manifest(folder: storage.PathLike) -> dict:
    path = storage.path(folder) / "manifest.json"
    if not path.exists():
        raise FileNotFoundError(
            f"{folder}: no manifest.json (not a prepared token folder; "
            f"python -m launch.prepare_data makes one)"
        )
    manifest = json.loads(path.read_text())
    if not manifest.get("complete"):
        raise ValueError(f"{folder}: its preparation did not finish (run it again to resume)")
    return manifest


def is_prepared(folder: storage.PathLike) -> bool:
    path = storage.path(folder) / "manifest.json"
    return path.exists() and json.loads(path.read_text()).get("complete", False)


def tokenizer_fingerprint(tokenizer) -> dict:
    """What identifies a tokenizer's ids: name, vocabulary, EOS, and the SHA-256 of its files."""
    h = hashlib.sha256()
    if hasattr(tokenizer, "folder"):  # the files' contents, shipped gzipped or not
        for name in ("encoder.json", "vocab.bpe"):
            h.update(bpe_file(storage.path(tokenizer.folder), name).encode("utf-8"))
    elif hasattr(tokenizer, "model_path"):
        h.update(storage.path(tokenizer.model_path).read_bytes())
    return {
        "name": tokenizer.name,
        "vocab_size": tokenizer.vocab_size,
        "eos_id": tokenizer.eos_id,
        "sha256": h.hexdigest(),
    }


def _upload(local: Path, remote, echo) -> None:
    """A locally prepared folder's files to ``remote``: shards (those of the same size already
    there are kept), the histogram, then the manifest."""
    manifest = json.loads((local / "manifest.json").read_text())
    remote.mkdir(parents=True, exist_ok=True)
    names = [s["file"] for s in manifest["shards"]] + ["counts.npy", "manifest.json"]
    for i, name in enumerate(names):
        target, size = remote / name, (local / name).stat().st_size
        if name != "manifest.json" and target.exists() and storage.size(target) == size:
            continue
        with open(local / name, "rb") as a, target.open("wb") as b:
            shutil.copyfileobj(a, b, 1 << 20)
        echo(f"uploaded {name} to {remote} ({i + 1}/{len(names)}, {size:,} bytes)")


# ---------------------------------------------------------------- preparing
_WORKER_TOKENIZER = None


def _init_worker(tokenizer):
    global _WORKER_TOKENIZER
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # one process, one core
    _WORKER_TOKENIZER = tokenizer


def _tokenize(texts: list[str]) -> list[np.ndarray]:
    tok = _WORKER_TOKENIZER
    if hasattr(tok, "encode_arrays"):  # GPT2BPE: no Python lists on the way
        return tok.encode_arrays(texts)
    return [np.asarray(ids, np.uint32) for ids in tok.encode_batch(texts)]


def _chunks(documents, chars: int):
    """Lists of documents of about ``chars`` characters."""
    chunk, size = [], 0
    for doc in documents:
        chunk.append(doc)
        size += len(doc)
        if size >= chars:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


class _Writer:
    """Appends tokens to the stream as blocks in shard files. A shard is closed (and the resume
    point recorded) at the end of the first chunk of documents that fills it, so the documents
    counted and the tokens pending always agree; shards hold ``shard_blocks`` blocks or a chunk
    more."""

    def __init__(self, folder, block: int, shard_blocks: int, state: dict):
        self.folder, self.block, self.shard_blocks = folder, block, shard_blocks
        self.shards = state.get("shards", [])
        self.pending = np.asarray(state.get("pending", []), np.uint32)
        self.documents = state.get("documents", 0)
        self.tokens = state.get("tokens", 0)
        self.counts = state.get("counts")
        self.writer, self.blocks_in_shard = None, 0

    def add_chunk(self, ids: np.ndarray, documents: int):
        """A chunk of whole documents' ids (EOS after each), in stream order."""
        self.documents += documents
        self.tokens += len(ids)
        data = np.concatenate([self.pending, ids])
        full = len(data) // self.block * self.block
        for a in range(0, full, self.block):
            self._write_block(data[a : a + self.block])
        self.pending = data[full:]
        if self.blocks_in_shard >= self.shard_blocks:
            self._close_shard()
            self.save_progress()

    def finish(self):
        if len(self.pending):
            self._write_block(self.pending)
            self.pending = self.pending[:0]
        self._close_shard()

    def _write_block(self, block: np.ndarray):
        if self.writer is None:
            from array_record.python.array_record_module import ArrayRecordWriter

            self.current = _shard_name(len(self.shards))
            self.writer = ArrayRecordWriter(str(self.folder / self.current), "group_size:1")
        self.writer.write(block.astype("<u4").tobytes())
        self.blocks_in_shard += 1

    def _close_shard(self):
        if self.writer is None:
            return
        self.writer.close()
        self.shards.append(
            {
                "file": self.current,
                "blocks": self.blocks_in_shard,
                "bytes": (self.folder / self.current).stat().st_size,
                "sha256": file_sha256(self.folder / self.current),
            }
        )
        self.writer, self.blocks_in_shard = None, 0

    def save_progress(self):
        """The resume point: finished shards, documents and tokens consumed, the tokens not yet
        in a written block, the histogram so far."""
        np.save(self.folder / "progress_counts.npy", self.counts)
        state = {
            "shards": self.shards,
            "documents": self.documents,
            "tokens": self.tokens,
            "pending": self.pending.tolist(),
        }
        tmp = self.folder / "progress.json.tmp"
        tmp.write_text(json.dumps(state))
        tmp.replace(self.folder / "progress.json")


def prepare(
    documents,
    tokenizer,
    out: storage.PathLike,
    *,
    source: dict,
    workers: int = 0,
    block: int = BLOCK,
    shard_blocks: int = SHARD_BLOCKS,
    chunk_chars: int = CHUNK_CHARS,
    total_chars: int | None = None,
    log_every_s: float = 10.0,
    echo=print,
):
    """Tokenise ``documents`` (an iterable of str, in a fixed order) into a prepared folder
    ``out`` (module docstring; a local path or a bucket URL) on ``workers`` processes (0: this
    one); resumes a stopped preparation of the same source and tokenizer. ``total_chars`` (the
    corpus' size, if known) gives the progress lines an ETA. Returns ``out``."""
    if storage.is_remote(out):
        remote = storage.path(out)
        if is_prepared(remote):
            return remote
        staging = storage.staging_folder(remote)  # prepared here, then uploaded
        prepare(
            documents,
            tokenizer,
            staging,
            source=source,
            workers=workers,
            block=block,
            shard_blocks=shard_blocks,
            chunk_chars=chunk_chars,
            total_chars=total_chars,
            log_every_s=log_every_s,
            echo=echo,
        )
        _upload(staging, remote, echo)
        return remote
    out = Path(out)  # local path: a URL took the branch above
    if is_prepared(out):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    # one preparer a folder: the processes of a run on one host start together, and wait
    with open(out.with_name(out.name + ".lock"), "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            echo(f"waiting for another process preparing {out}")
            fcntl.flock(lock, fcntl.LOCK_EX)
        if is_prepared(out):
            return out
        return _prepare(
            documents,
            tokenizer,
            out,
            source=source,
            workers=workers,
            block=block,
            shard_blocks=shard_blocks,
            chunk_chars=chunk_chars,
            total_chars=total_chars,
            log_every_s=log_every_s,
            echo=echo,
        )


def _prepare(
    documents,
    tokenizer,
    out: Path,
    *,
    source,
    workers,
    block,
    shard_blocks,
    chunk_chars,
    total_chars,
    log_every_s,
    echo,
) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    meta = {"tokenizer": tokenizer_fingerprint(tokenizer), "source": source}
    started = out / "started.json"
    if started.exists() and json.loads(started.read_text()) != meta:
        raise ValueError(
            f"{out} holds an unfinished preparation of another source or tokenizer "
            f"({started}); remove the folder or choose another --out"
        )
    started.write_text(json.dumps(meta))
    state = {}
    if (out / "progress.json").exists():
        state = json.loads((out / "progress.json").read_text())
        state["counts"] = np.load(out / "progress_counts.npy")
        echo(
            f"resuming {out}: {len(state['shards'])} shards, {state['documents']:,} documents done"
        )
    for f in out.glob("tokens-*.array_record"):
        if f.name not in {s["file"] for s in state.get("shards", [])}:
            f.unlink()  # a shard cut off before it finished
    writer = _Writer(out, block, shard_blocks, state)
    if writer.counts is None:
        writer.counts = np.zeros(tokenizer.vocab_size, np.int64)
    skip = writer.documents
    eos = np.array([tokenizer.eos_id], np.uint32)
    t0 = t_log = time.time()
    chars = chars_skipped = 0  # characters read: tokenised, and skipped over

    def docs():
        nonlocal chars, chars_skipped
        for i, d in enumerate(documents):
            if i < skip:
                chars_skipped += len(d)
                continue
            chars += len(d)
            yield d

    def results():
        chunks = _chunks(docs(), chunk_chars)
        if not workers:
            _init_worker(tokenizer)
            for chunk in chunks:
                yield _tokenize(chunk)
            return
        ctx = multiprocessing.get_context("spawn")
        with ctx.Pool(workers, initializer=_init_worker, initargs=(tokenizer,)) as pool:
            inflight = collections.deque()
            for chunk in chunks:  # at most 2 x workers chunks in flight
                inflight.append(pool.apply_async(_tokenize, (chunk,)))
                if len(inflight) >= 2 * workers:
                    yield inflight.popleft().get()
            while inflight:
                yield inflight.popleft().get()

    tokens_at_start = writer.tokens
    for encoded in results():
        if encoded:
            writer.counts += np.bincount(
                np.concatenate(encoded).astype(np.int64), minlength=len(writer.counts)
            )[: len(writer.counts)]
        writer.counts[tokenizer.eos_id] += len(encoded)
        writer.add_chunk(
            np.concatenate([x for ids in encoded for x in (ids, eos)] or [eos[:0]]), len(encoded)
        )
        now = time.time()
        if now - t_log >= log_every_s:
            t_log = now
            rate = (writer.tokens - tokens_at_start) / max(now - t0, 1e-9)
            speed = chars / max(now - t0, 1e-9)
            left = max(total_chars - chars - chars_skipped, 0) if total_chars else 0
            eta = (
                f", ETA {datetime.timedelta(seconds=int(left / speed))}"
                if total_chars and speed
                else ""
            )
            echo(
                f"prepare: {writer.documents:,} documents, {writer.tokens:,} tokens, "
                f"{rate / 1e3:,.0f}k tokens/s, {speed / 2**20:.1f} MiB/s of text{eta}"
            )
    writer.finish()
    if not writer.tokens:
        raise ValueError(f"{source}: holds no text (0 documents)")
    np.save(out / "counts.npy", writer.counts)
    elapsed = time.time() - t0
    manifest = {
        **meta,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "documents": writer.documents,
        "tokens": writer.tokens,
        "block": block,
        "shards": writer.shards,
        "workers": workers,
        "seconds": round(elapsed, 1),
        "complete": True,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2))
    for f in ("progress.json", "progress_counts.npy", "started.json"):
        (out / f).unlink(missing_ok=True)
    echo(
        f"prepared {out}: {writer.documents:,} documents, {writer.tokens:,} tokens in "
        f"{len(writer.shards)} shard(s), {elapsed:.1f}s "
        f"({(writer.tokens - tokens_at_start) / max(elapsed, 1e-9) / 1e3:,.0f}k tokens/s)"
    )
    return out
