"""A share of synthetic needle-retrieval sequences mixed into the packed training text.

At the `small` scale (tens of millions of tokens) retrieval of an arbitrary string from far back
does not emerge from books alone, and every model scores 0 on NIAH, which says nothing about the
architectures. ``RetrievalMix`` appends synthetic sequences to a ``PackedSequences`` source so
that a fixed share of training sequences teach the *format* of the RULER NIAH task while the
*lengths* it is evaluated at stay unseen. Each synthetic sequence is

    [header] [haystack a] [needle] [haystack b] [question + answer prefix] [value] "." EOS [text]

- header, needle, question and answer use RULER's niah_single templates
  (``hwh_jax.eval.niah``), the value a random 7-digit number or UUID (half each), the key a
  random adjective-noun pair;
- the haystack is a slice of the *training* token stream (books), never the Paul Graham essays
  or the noise sentences of the evaluation; the needle sits at a uniformly random token depth;
- the haystack is 0 to (L - template) tokens long, uniformly, so the document (header to value)
  is ~100 tokens to all of the training length L; the rest of the window continues with
  training text after an EOS. No synthetic document is
  longer than L, so NIAH at 2L and 4L measures extrapolation.

Every token is trained on (the loss mask is 1), as for text. The synthetic sequence of index i
is a pure function of (seed, i): resuming or resharding reproduces it.
"""
from __future__ import annotations

import uuid

import numpy as np

from hwh_jax.data.packing import PackedSequences, segments_and_positions
from hwh_jax.eval import niah


class RetrievalMix:
    """``PackedSequences`` text windows followed by ``round(n * share / (1 - share))``
    synthetic retrieval windows: a Grain random-access source whose shuffle mixes them."""

    def __init__(self, text: PackedSequences, tokenizer, share: float, *, seed: int = 0):
        if not 0 < share < 1:
            raise ValueError(f"retrieval share must lie in (0, 1), got {share}")
        self.text, self.tokenizer, self.share, self.seed = text, tokenizer, share, seed
        self.seq_len, self.window = text.seq_len, text.window
        self.eos_id, self.pad_id = text.eos_id, text.pad_id
        self.num_text = len(text)
        self.num_synthetic = max(1, round(self.num_text * share / (1 - share)))
        longest = max(niah.WORDS, key=len)
        need = 1 + max(sum(len(tokenizer.encode(s)) for s in self._pieces(kind, longest, value))
                       for kind, value in (("numbers", "9" * 7), ("uuids", str(uuid.UUID(int=0)))))
        if need >= self.window:
            raise ValueError(f"seq_len {self.seq_len} is too short for synthetic retrieval "
                             f"sequences: their template alone takes up to {need} tokens")
        if len(text.stream) < 2 * self.window:
            raise ValueError("the training stream is too short to cut haystacks from")

    @staticmethod
    def _pieces(kind: str, key: str, value: str) -> list[str]:
        header, rest = niah.TEMPLATE.split("{context}")
        return [header.format(type_needle_v=kind),
                " " + niah.NEEDLE.format(type_needle_v=kind, key=key, value=value) + " ",
                rest.format(type_needle_v=kind, query=key)
                + niah.ANSWER_PREFIX.format(type_needle_v1=kind[:-1], query=key),
                f" {value}."]

    @property
    def stream(self) -> np.ndarray:
        """The text token stream (the synthetic sequences are cut from it)."""
        return self.text.stream

    def __len__(self) -> int:
        return self.num_text + self.num_synthetic

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        i = int(i)
        if not 0 <= i < len(self):
            raise IndexError(f"sequence {i} out of range [0, {len(self)})")
        if i < self.num_text:
            return self.text[i]
        return self.synthetic(i - self.num_text) | {"index": np.int32(i)}

    def synthetic(self, j: int) -> dict[str, np.ndarray]:
        """The j-th synthetic window (inputs, targets, segment_ids, positions, loss_mask)."""
        rng = np.random.default_rng((self.seed, 0x5EED, j))
        kind = ("numbers", "uuids")[int(rng.integers(2))]
        key = niah.WORDS[int(rng.integers(len(niah.WORDS)))]
        value = (str(int(rng.integers(10 ** 6, 10 ** 7))) if kind == "numbers"
                 else str(uuid.UUID(int=int.from_bytes(rng.bytes(16), "little"), version=4)))
        header, needle, question, answer = (self.tokenizer.encode(s) for s in
                                            self._pieces(kind, key, value))
        fixed = len(header) + len(needle) + len(question) + len(answer) + 1   # + EOS
        hay = int(rng.integers(0, max(self.window - fixed, 0) + 1))
        stream = self.text.stream
        start = int(rng.integers(0, len(stream) - self.window))
        haystack = np.asarray(stream[start:start + hay], np.int32)
        at = int(rng.integers(0, hay + 1))
        doc = np.concatenate([header, haystack[:at], needle, haystack[at:], question, answer,
                              [self.eos_id]]).astype(np.int32)
        fill = self.window - len(doc)
        if fill < 0:   # the template alone is longer than the window: never cut it silently
            raise ValueError(f"synthetic retrieval sequence {j}: template of {fixed} tokens "
                             f"exceeds the window of {self.window}")
        start = int(rng.integers(0, len(stream) - self.window))
        w = np.concatenate([doc, np.asarray(stream[start:start + fill], np.int32)])
        seg, pos = segments_and_positions(w, self.eos_id, self.window)
        return {"inputs": w[:-1], "targets": w[1:], "segment_ids": seg[:-1],
                "positions": pos[:-1], "loss_mask": np.ones(self.seq_len, np.float32)}

    def __repr__(self):
        return (f"RetrievalMix({self.num_text} text + {self.num_synthetic} synthetic retrieval "
                f"x {self.seq_len}, share {self.share})")
