"""Tokenizers: GPT-2 byte-level BPE from its original files, SentencePiece (directly or through
seqio's ``SentencePieceVocabulary``), and a small SentencePiece model trained on the corpus.

All expose ``encode(str) -> list[int]``, ``encode_batch(list[str]) -> list[list[int]]``,
``decode(ids) -> str``, ``vocab_size``, ``eos_id``, ``pad_id`` and ``name`` (which keys the
token caches). ``GPT2BPE`` runs on tiktoken's BPE (Rust) with GPT-2's pre-tokenizer as array
operations (``bpe_pieces``); ``GPT2BPEReference`` is the same algorithm in plain Python
(Radford et al.'s ``encoder.py``), the specification the fast one is tested against.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import importlib.util
import itertools
import json
import logging
import re
import threading
import time
from pathlib import Path

import numpy as np
import regex

from hwh_jax import storage
from hwh_jax.data import bpe_pieces

log = logging.getLogger(__name__)


@functools.lru_cache()
def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable unicode characters."""
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def bpe_file(folder: Path, name: str) -> str:
    """The text of a GPT-2 BPE file ``name`` in ``folder``, plain or gzipped (``name.gz``, as
    the project ships them)."""
    import gzip

    if (folder / name).exists():
        return (folder / name).read_bytes().decode("utf-8")
    if (folder / f"{name}.gz").exists():
        return gzip.decompress((folder / f"{name}.gz").read_bytes()).decode("utf-8")
    raise FileNotFoundError(f"GPT-2 BPE file missing: {folder / name} (or {name}.gz)")


class GPT2BPEReference:
    """Byte-level BPE (Radford et al., 2019) read from ``encoder.json`` and ``vocab.bpe``, in
    plain Python: a regex split into pieces, each piece's UTF-8 bytes mapped to printable
    characters, then merged pair by pair in the order of ``vocab.bpe``."""

    PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

    def __init__(self, folder: str | Path):
        folder = storage.path(folder)
        self.encoder = json.loads(bpe_file(folder, "encoder.json"))
        self.decoder = {v: k for k, v in self.encoder.items()}
        merges = bpe_file(folder, "vocab.bpe").split("\n")[1:]
        self.ranks = {tuple(m.split()): i for i, m in enumerate(merges) if m}
        self.byte_encoder = _bytes_to_unicode()
        self.byte_decoder = {v: k for k, v in self.byte_encoder.items()}
        self.pat = regex.compile(self.PATTERN)
        self.cache: dict[str, list[str]] = {}
        self.eos_id = self.encoder["<|endoftext|>"]
        self.pad_id = self.eos_id
        self.vocab_size = len(self.encoder)
        self.name = "gpt2_bpe"

    def _bpe(self, token: str) -> list[str]:
        if token in self.cache:
            return self.cache[token]
        word = list(token)
        while len(word) > 1:
            pairs = {(word[i], word[i + 1]) for i in range(len(word) - 1)}
            best = min(pairs, key=lambda p: self.ranks.get(p, float("inf")))
            if best not in self.ranks:
                break
            merged, i = [], 0
            while i < len(word):
                if i < len(word) - 1 and (word[i], word[i + 1]) == best:
                    merged.append(word[i] + word[i + 1])
                    i += 2
                else:
                    merged.append(word[i])
                    i += 1
            word = merged
        self.cache[token] = word
        return word

    def encode(self, text: str) -> list[int]:
        ids = []
        for piece in self.pat.findall(text):
            mapped = "".join(self.byte_encoder[b] for b in piece.encode("utf-8"))
            ids.extend(self.encoder[t] for t in self._bpe(mapped))
        return ids

    def encode_batch(self, texts) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def decode(self, ids) -> str:
        text = "".join(self.decoder[int(i)] for i in ids)
        return bytearray(self.byte_decoder[c] for c in text).decode("utf-8", errors="replace")


class GPT2BPE:
    r"""GPT-2's byte-level BPE from ``encoder.json`` and ``vocab.bpe`` through tiktoken (Rust):
    the merge ranks of ``encoder.json`` over raw bytes, GPT-2's regex, no special-token
    handling (``<|endoftext|>`` in text is text, as in the reference). The same ids as
    ``GPT2BPEReference`` (tests); speed on one core in docs/training.md.

    Speed: tiktoken splits text with GPT-2's regex, whose white-space look-ahead
    (``\s+(?!\S)``) puts it on a backtracking regex engine, then looks each piece up. Here the
    split is a few NumPy passes over the code points of a whole batch of texts
    (``bpe_pieces.piece_starts``), and the pieces' ids come from a hash table of the pieces
    seen before (``bpe_pieces.PieceTable``), filled by tiktoken's BPE of one piece: the function
    tiktoken itself applies to each piece. ``encode_exact`` is tiktoken with GPT-2's own regex,
    the fast path's reference in tests and the path of texts with lone surrogates."""

    def __init__(self, folder: str | Path):
        import tiktoken

        folder = storage.path(folder)
        bpe_file(folder, "vocab.bpe")  # both files must be there
        encoder = json.loads(bpe_file(folder, "encoder.json"))
        to_byte = {c: b for b, c in _bytes_to_unicode().items()}
        self.eos_id = encoder["<|endoftext|>"]
        ranks = {
            bytes(to_byte[c] for c in piece): i for piece, i in encoder.items() if i != self.eos_id
        }
        special = {"<|endoftext|>": self.eos_id}
        self.enc = tiktoken.Encoding(
            "gpt2_bpe", pat_str=_TIKTOKEN_PATTERN, mergeable_ranks=ranks, special_tokens=special
        )
        self._table = None  # bpe_pieces.PieceTable, built on first use
        self._lock = threading.Lock()  # the table is filled in place: one encoder at a time
        self.pad_id = self.eos_id
        self.vocab_size = len(encoder)
        self.name = "gpt2_bpe"
        self.folder = folder

    def __reduce__(self):  # worker processes rebuild it from its files
        return GPT2BPE, (self.folder,)

    def encode_array(self, text: str) -> np.ndarray:
        """The ids of ``text`` as uint32 (no Python list on the way)."""
        return self.encode_arrays([text])[0]

    def encode(self, text: str) -> list[int]:
        return self.encode_array(text).tolist()

    def encode_exact(self, text: str) -> list[int]:
        return self.enc.encode_ordinary(text)

    def encode_batch(self, texts) -> list[list[int]]:
        return [ids.tolist() for ids in self.encode_arrays(texts)]

    def encode_arrays(self, texts) -> list[np.ndarray]:
        """The ids of each text as uint32, all texts encoded at once. Safe from several threads
        (grain's in-process prefetch calls a source's ``__getitem__`` from a thread pool)."""
        with self._lock:
            return self._encode_arrays(list(texts))

    def _encode_arrays(self, texts: list[str]) -> list[np.ndarray]:
        if self._table is None:
            self._table = bpe_pieces.PieceTable(self.enc)
        try:
            return bpe_pieces.encode_documents(texts, self._table)
        except UnicodeEncodeError:  # lone surrogates somewhere: those texts go
            pass  # tiktoken's own way
        plain = [i for i, t in enumerate(texts) if _encodable(t)]
        out = [None] * len(texts)
        for i, ids in zip(
            plain, bpe_pieces.encode_documents([texts[i] for i in plain], self._table)
        ):
            out[i] = ids
        return [
            np.asarray(self.encode_exact(t), np.uint32) if ids is None else ids
            for t, ids in zip(texts, out)
        ]

    def decode(self, ids) -> str:
        return self.enc.decode([int(i) for i in ids], errors="replace")


# GPT2BPEReference.PATTERN in the form tiktoken's regex engine takes (the same alternatives)
_TIKTOKEN_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


class SentencePieceTokenizer:
    """A SentencePiece ``.model``; through seqio's SentencePieceVocabulary if seqio is installed
    (``use_seqio=None``: when available), else the sentencepiece library directly."""

    def __init__(self, model_path: str | Path, *, use_seqio: bool | None = None):
        if not storage.path(model_path).exists():
            raise FileNotFoundError(f"SentencePiece model not found: {model_path}")
        model_path = storage.local_copy(model_path)  # a bucket's model: read from a copy
        if use_seqio is None:
            use_seqio = importlib.util.find_spec("seqio") is not None
        self.backend = "seqio" if use_seqio else "sentencepiece"
        if use_seqio:
            import seqio

            self.vocab = seqio.SentencePieceVocabulary(str(model_path))
            self.sp = self.vocab.tokenizer
        else:
            import sentencepiece as spm

            self.vocab = None
            self.sp = spm.SentencePieceProcessor(model_file=str(model_path))
        self.eos_id = int(self.sp.eos_id())
        self.pad_id = max(int(self.sp.pad_id()), 0)
        self.vocab_size = int(self.sp.get_piece_size())
        digest = hashlib.sha256(model_path.read_bytes()).hexdigest()[:12]
        self.name = f"sp_{digest}"
        self.model_path, self.use_seqio = model_path, use_seqio

    def __reduce__(self):  # worker processes reload it from its file
        return _sentencepiece, (self.model_path, self.use_seqio)

    def encode(self, text: str) -> list[int]:
        if self.vocab is not None:
            return list(self.vocab.encode(text))
        return self.sp.encode(text)

    def encode_batch(self, texts) -> list[list[int]]:
        if self.vocab is not None:
            return [self.encode(t) for t in texts]
        return self.sp.encode(list(texts))

    def decode(self, ids) -> str:
        if self.vocab is not None:
            return self.vocab.decode([int(i) for i in ids])
        return self.sp.decode([int(i) for i in ids])


def _sentencepiece(model_path, use_seqio):
    return SentencePieceTokenizer(model_path, use_seqio=use_seqio)


def train_sentencepiece(
    documents,
    vocab_size: int,
    out_dir: Path,
    *,
    key: str,
    max_sentences: int = 300_000,
    where: str = "the corpus",
) -> Path:
    """Train (once, then cached under ``out_dir/key``) a BPE SentencePiece model with byte
    fallback, pad=0, eos=1, unk=2, bos=3, on lines of ``documents`` (an iterable of str).
    A corpus too small for ``vocab_size`` pieces is refused naming ``data.sp_vocab_size``."""
    prefix = out_dir / f"spm_{key}_{vocab_size}"
    model = prefix.with_suffix(".model")
    if model.exists():
        return model
    out_dir.mkdir(parents=True, exist_ok=True)
    # one trainer a vocabulary: the processes of a run on one host start together, and wait
    with open(prefix.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not model.exists():
            log.info(
                "training a SentencePiece vocabulary of %d pieces on %s (once: cached as %s)",
                vocab_size,
                where,
                model,
            )
            t = time.time()
            _train_sentencepiece(documents, vocab_size, prefix, max_sentences, where)
            log.info("trained the SentencePiece vocabulary in %.1fs", time.time() - t)
    return model


def _train_sentencepiece(documents, vocab_size, prefix: Path, max_sentences, where):
    import sentencepiece as spm

    lines = (line for doc in documents for line in doc.splitlines() if line.strip())
    first = next(lines, None)
    if first is None:
        raise ValueError(f"{where} holds no text to train the SentencePiece vocabulary on")
    tmp = prefix.with_suffix(".partial")
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=itertools.chain([first], lines),
            model_prefix=str(tmp),
            vocab_size=vocab_size,
            model_type="bpe",
            byte_fallback=True,
            character_coverage=1.0,
            input_sentence_size=max_sentences,
            shuffle_input_sentence=True,
            pad_id=0,
            eos_id=1,
            unk_id=2,
            bos_id=3,
            num_threads=2,
            minloglevel=2,
        )
    except RuntimeError as e:
        most = re.search(r"<= (\d+)", str(e))
        hint = f" (at most {most.group(1)} here)" if most else ""
        raise ValueError(
            f"{where}: too little text for a SentencePiece vocabulary of "
            f"data.sp_vocab_size={vocab_size} pieces{hint}; set a smaller "
            f"--config.data.sp_vocab_size or give more text"
        ) from None
    tmp.with_suffix(".partial.vocab").rename(prefix.with_suffix(".vocab"))
    tmp.with_suffix(".partial.model").rename(prefix.with_suffix(".model"))  # the marker: last
