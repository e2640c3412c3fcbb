"""From a data spec to Grain iterators of packed batches, with a checkpointable state.

Order: the packed sequences are shuffled by seed (a fresh permutation every epoch) and repeated;
process p of P takes items p, p + P, p + 2P, ... so that the P local batches of a step together
form exactly one global batch, whatever P is. The iterator's state is Grain's ``get_state()``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
from pathlib import Path

import grain
import numpy as np

from hwh_jax import checks, storage
from hwh_jax.data import shards, sources
from hwh_jax.data.packing import PackedSequences, concat_documents
from hwh_jax.data.paths import cache_dir, resolve
from hwh_jax.data.retrieval import FORMATS as RETRIEVAL_FORMATS
from hwh_jax.data.retrieval import RetrievalMix
from hwh_jax.data.sources import DECODE_ERRORS
from hwh_jax.data.tokenizers import GPT2BPE, SentencePieceTokenizer, train_sentencepiece

log = logging.getLogger(__name__)
TOKENIZERS = ("gpt2", "sentencepiece", "train_sentencepiece")
SOURCES = ("text", "tfds", "arrayrecord", "shards")


@dataclasses.dataclass(frozen=True)
class DataSpec:
    """Where the training text comes from and how it is tokenised and mixed; every field is the
    ``data.*`` config key of the same name. ``validate`` checks them and that the files exist."""

    source: str = "text"  # "text" | "tfds" | "arrayrecord" | "shards" (prepared)
    paths: tuple[str, ...] = ("dickens/dickens.zip",)  # text/arrayrecord files (data-dir relative)
    heldout_paths: tuple[str, ...] = ()  # explicit held-out files; else the stream's tail
    heldout_fraction: float = 0.01  # share of the stream held out when no heldout_paths
    text_field: str = "text"  # jsonl / TFDS text field
    tfds_name: str = ""
    tfds_split: str = "train"
    tfds_heldout_split: str = ""
    tfds_data_dir: str = ""
    decode_errors: str = "replace"  # invalid UTF-8 in text: "replace" (read as U+FFFD,
    #                                       with a warning naming file and line) | "strict"
    tokenizer: str = "train_sentencepiece"  # "gpt2" | "sentencepiece" | "train_sentencepiece"
    sp_model: str = ""  # .model path for tokenizer="sentencepiece"
    sp_vocab_size: int = 4096  # vocabulary of the trained SentencePiece model
    data_dir: str = ""  # the user's data folder (default $HWH_DATA_DIR)
    retrieval_share: float = 0.0  # share of synthetic NIAH-format training sequences
    retrieval_answer_weight: float = 1.0  # loss weight of their answers' value tokens
    retrieval_max_needles: int = 4  # needles per synthetic document: 1..this (all asked)
    retrieval_format: str = "ruler"  # their wording: "ruler" (NIAH's own templates) | "pairs"
    #                                  (another wording, numbers only: NIAH's format untaught)
    workers: int = 0  # grain worker processes building training batches

    def validate(self, files: bool = True):
        """Every field checked; with ``files``, that the paths exist too."""
        if self.source not in SOURCES:
            raise ValueError(f"data.source must be one of {SOURCES}, got {self.source!r}")
        if self.tokenizer not in TOKENIZERS:
            raise ValueError(f"data.tokenizer must be one of {TOKENIZERS}, got {self.tokenizer!r}")
        checks.number("data.heldout_fraction", self.heldout_fraction, lo=0, hi=1, hi_open=True)
        checks.number("data.retrieval_share", self.retrieval_share, lo=0, hi=1, hi_open=True)
        checks.number("data.retrieval_answer_weight", self.retrieval_answer_weight, lo=1)
        checks.number("data.workers", self.workers, lo=0, integer=True)
        checks.number("data.retrieval_max_needles", self.retrieval_max_needles, lo=1, integer=True)
        if self.retrieval_format not in RETRIEVAL_FORMATS:
            raise ValueError(
                f"data.retrieval_format must be one of {list(RETRIEVAL_FORMATS)}, got "
                f"{self.retrieval_format!r}"
            )
        checks.number("data.sp_vocab_size", self.sp_vocab_size, lo=16, integer=True)
        if self.decode_errors not in DECODE_ERRORS:
            raise ValueError(
                f"data.decode_errors must be one of {DECODE_ERRORS}, got {self.decode_errors!r}"
            )
        if self.source in ("text", "arrayrecord", "shards"):
            if not self.paths:
                raise ValueError("data.paths is empty")
            for p in (self.paths + self.heldout_paths) if files else ():
                try:
                    resolve(p, self.data_dir or None)  # FileNotFoundError naming where it looked
                except FileNotFoundError as e:
                    if self.source != "shards":
                        raise
                    raise FileNotFoundError(
                        f"{e}; a shards folder is made by python -m "
                        f"launch.prepare_data --input=TEXT --out=FOLDER "
                        f"(docs/training.md, 'Data at scale')"
                    ) from None
        if self.source == "tfds" and not self.tfds_name:
            raise ValueError("data.source='tfds' needs data.tfds_name")
        if self.tokenizer == "sentencepiece" and not storage.path(self.sp_model).exists():
            raise FileNotFoundError(f"data.sp_model not found: {self.sp_model!r}")


def _files(spec: DataSpec, paths) -> list[Path]:
    return sources.expand([resolve(p, spec.data_dir or None) for p in paths])


def _documents(spec: DataSpec, heldout: bool):
    if spec.source == "tfds":
        split = spec.tfds_heldout_split if heldout else spec.tfds_split
        return sources.tfds_documents(
            spec.tfds_name, split, data_dir=spec.tfds_data_dir or None, text_field=spec.text_field
        )
    paths = spec.heldout_paths if heldout else spec.paths
    return (
        doc
        for f in _files(spec, paths)
        for doc in sources.text_documents(f, spec.text_field, spec.decode_errors)
    )


def _fingerprint(spec: DataSpec, paths) -> str:
    fields = dataclasses.asdict(spec)
    mixed = ("retrieval_share", "retrieval_answer_weight", "retrieval_max_needles")
    for name in (*mixed, "retrieval_format", "workers"):
        fields.pop(name)  # mixed in / batched after tokenisation: same tokenizer, same tokens
    # (decode_errors stays: a strict run must read the text itself, not a cache a lenient run
    # made of it with U+FFFD in place of the invalid bytes)
    h = hashlib.sha256(json.dumps(fields, sort_keys=True).encode())
    if spec.source != "tfds":
        for f in _files(spec, paths):
            st = f.stat()
            h.update(f"{f}:{st.st_size}:{int(st.st_mtime)}".encode())
    return h.hexdigest()[:16]


def load_tokenizer(spec: DataSpec):
    if spec.tokenizer == "gpt2":
        return GPT2BPE(resolve("gpt2_bpe", spec.data_dir or None))
    if spec.tokenizer == "sentencepiece":
        return SentencePieceTokenizer(spec.sp_model)
    if spec.source in ("arrayrecord", "shards"):
        raise ValueError(
            f"pre-tokenised data (data.source={spec.source!r}) needs "
            f"data.tokenizer 'gpt2' or 'sentencepiece', the one it was made with"
        )
    model = train_sentencepiece(
        _documents(spec, heldout=False),
        spec.sp_vocab_size,
        cache_dir() / "tokenizers",
        key=_fingerprint(dataclasses.replace(spec, heldout_paths=()), spec.paths),
        where=f"data.paths {spec.paths}",
    )
    return SentencePieceTokenizer(model, use_seqio=False)  # ours: no TensorFlow import


AUTO_WORKERS_ABOVE = 256 << 20  # bytes of text above which preparation uses every core


def token_stream(spec: DataSpec, tokenizer, heldout: bool = False):
    """The token stream of the train or explicit held-out documents: for text and TFDS
    sources a ``TokenStream`` over shards prepared once into the cache (``shards.prepare``;
    in parallel above 256 MiB of text), for ``shards`` the prepared folder named in
    ``data.paths``, for pre-tokenised ArrayRecord documents an array in memory."""
    paths = spec.heldout_paths if heldout else spec.paths
    key_name = "data.heldout_paths" if heldout else "data.paths"
    if spec.source == "shards":
        if len(paths) != 1:
            raise ValueError(f"{key_name} must name one prepared folder, got {tuple(paths)}")
        stream = shards.TokenStream(resolve(paths[0], spec.data_dir or None))
        want, have = shards.tokenizer_fingerprint(tokenizer), stream.manifest["tokenizer"]
        if want != have:
            raise ValueError(
                f"{stream.folder} was prepared with tokenizer {have['name']} "
                f"({have['sha256'][:12]}), this run uses {want['name']} "
                f"({want['sha256'][:12]}): prepare it again or set data.tokenizer"
            )
        return stream
    if spec.source == "arrayrecord":
        docs = sources.arrayrecord_tokens([resolve(p, spec.data_dir or None) for p in paths])
        stream = concat_documents(docs, tokenizer.eos_id)
        if not len(stream):
            raise ValueError(f"{key_name} {tuple(paths)} holds no tokens")
        return stream
    key = f"{_fingerprint(spec, paths)}_{tokenizer.name}_{'heldout' if heldout else 'train'}"
    folder = cache_dir() / "shards" / key
    if not shards.is_prepared(folder):
        size = None
        if spec.source != "tfds":
            size = sum(f.stat().st_size for f in _files(spec, paths))
        workers = (os.cpu_count() or 1) if size and size > AUTO_WORKERS_ABOVE else 0
        source = (
            {
                "tfds": spec.tfds_name,
                "split": spec.tfds_heldout_split if heldout else spec.tfds_split,
            }
            if spec.source == "tfds"
            else {"paths": [str(f) for f in _files(spec, paths)]}
        )
        try:
            shards.prepare(
                _documents(spec, heldout),
                tokenizer,
                folder,
                source=source,
                workers=workers,
                total_chars=size,
                echo=log.info,
            )
        except ValueError as e:
            if "holds no text" in str(e):
                raise ValueError(
                    f"{key_name} {tuple(paths)} holds no text (0 tokens); give files with text"
                ) from None
            raise
    return shards.TokenStream(folder)


def split_tail(stream, n: int):
    """(stream without its last n tokens, those n tokens), as views of a TokenStream."""
    cut = len(stream) - n
    if isinstance(stream, shards.TokenStream):
        return stream.view(0, cut), stream.view(cut, len(stream))
    return stream[:cut], stream[cut:]


@dataclasses.dataclass
class Splits:
    """The packed training sequences (with the synthetic retrieval mix, if any), the held-out
    sequences (None without a held-out share) and the tokenizer that made them."""

    train: PackedSequences | RetrievalMix
    heldout: PackedSequences
    tokenizer: object


def build_splits(spec: DataSpec, seq_len: int, check_tokenizer=None) -> Splits:
    """Tokenise (or load from cache) and pack the train and held-out splits;
    ``check_tokenizer(tokenizer)``, if given, runs before the corpus is tokenised (what a run
    can refuse by its tokenizer, it refuses before that work)."""
    spec.validate()
    tok = load_tokenizer(spec)
    if check_tokenizer is not None:
        check_tokenizer(tok)
    kw = dict(eos_id=tok.eos_id, pad_id=tok.pad_id)
    stream = token_stream(spec, tok)
    has_heldout = bool(spec.heldout_paths) or (spec.source == "tfds" and spec.tfds_heldout_split)
    if has_heldout:
        heldout = token_stream(spec, tok, heldout=True)
    else:
        n_held = int(len(stream) * spec.heldout_fraction) // (seq_len + 1) * (seq_len + 1)
        if spec.heldout_fraction > 0:
            n_held = max(n_held, seq_len + 1)
        if n_held >= len(stream):
            raise ValueError(
                f"held-out share {spec.heldout_fraction} of {len(stream)} tokens "
                f"leaves no training data at seq_len {seq_len}"
            )
        stream, heldout = split_tail(stream, n_held)
    for name, s in (("the training split", stream), ("the held-out split", heldout)):
        if 0 < len(s) < seq_len + 1:
            raise ValueError(
                f"{name} has {len(s)} tokens, fewer than one sequence of "
                f"seq_len + 1 = {seq_len + 1}: give more text or a smaller seq_len"
            )
    train = PackedSequences(stream, seq_len, **kw)
    if spec.retrieval_share:
        train = RetrievalMix(
            train,
            tok,
            spec.retrieval_share,
            answer_weight=spec.retrieval_answer_weight,
            max_needles=spec.retrieval_max_needles,
            fmt=spec.retrieval_format,
        )
    return Splits(train, PackedSequences(heldout, seq_len, **kw) if len(heldout) > 1 else None, tok)


def _stack(batch_list):
    return {k: np.stack([b[k] for b in batch_list]) for k in batch_list[0]}


def train_dataset(
    seqs: PackedSequences,
    *,
    global_batch: int,
    seed: int,
    process_index: int = 0,
    process_count: int = 1,
    workers: int = 0,
) -> grain.IterDataset:
    """Infinite, shuffled (per epoch, by seed), per-process slice of global batches. With
    ``workers`` > 0 the batches are built in that many grain worker processes (same batches,
    same order; the iterator's checkpointed state then records the workers, so a run resumes
    with the worker count it saved with)."""
    if global_batch % process_count:
        raise ValueError(f"global batch {global_batch} not divisible by {process_count} processes")
    ds = grain.MapDataset.source(seqs).shuffle(seed=seed).repeat(None)
    ds = ds[process_index::process_count].batch(global_batch // process_count, batch_fn=_stack)
    ds = ds.to_iter_dataset()
    if workers:
        ds = ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=workers))
    return ds


def eval_order(n: int, sequences: int, seed: int = 0) -> np.ndarray:
    """The held-out rows an evaluation scores: the first ``sequences`` (0: all ``n``) of a
    permutation of the held-out stream fixed by ``seed``, so that every run scores the same
    text whatever its micro-batch, batch or devices, and a sample is spread over the stream
    (in stream order the first rows are all one book)."""
    order = np.random.default_rng(seed).permutation(n)
    return order[: min(sequences, n)] if sequences else order


def eval_batches(seqs: PackedSequences, *, batch: int, sequences: int = 0, seed: int = 0):
    """Deterministic held-out batches of ``batch`` rows over ``eval_order``'s rows (the last
    batch padded with masked rows, which score nothing)."""
    rows = eval_order(len(seqs), sequences, seed)
    for b in range(0, len(rows), batch):
        part = [seqs[int(i)] for i in rows[b : b + batch]]
        yield _stack(part + [_masked(part[0])] * (batch - len(part)))


def _masked(row):
    row = dict(row)
    row["loss_mask"] = np.zeros_like(row["loss_mask"])
    return row
