"""A share of synthetic needle-retrieval sequences mixed into the packed training text.

At the `small` scale (tens of millions of tokens) retrieval of an arbitrary string from far back
does not emerge from books alone, and every model scores 0 on NIAH, which says nothing about the
architectures. ``RetrievalMix`` appends synthetic sequences to a ``PackedSequences`` source so
that a fixed share of training sequences teach the *format* of the RULER NIAH task while the
*lengths* it is evaluated at stay unseen. Each synthetic sequence is

    [header] [haystack with k needles] [k x (question + answer prefix + value ".")] EOS [text]

- header, needles, questions and answers use RULER's niah_single templates
  (``hwh_jax.data.ruler``, as the evaluation ``hwh_jax.eval.niah`` does; with k = 1 the document
  is a NIAH prompt followed by its answer); the values are random 7-digit numbers or UUIDs (one
  kind per document, half each), the keys distinct random adjective-noun pairs;
- k is uniform in 1..``max_needles``, lowered until the template fills at most 3/4 of the
  window; every needle is asked for, in a random order (k answers per document: more signal
  per sequence, and a model must match the key, not copy the one number it saw);
- the haystack is a slice of the *training* token stream (books), never the Paul Graham essays
  or the noise sentences of the evaluation; needles sit at uniformly random token depths;
- the haystack is 0 to (L - template) tokens long, uniformly; the rest of the window continues
  with training text after an EOS. No synthetic document is longer than L, so NIAH at 2L and
  4L measures extrapolation.

``fmt="pairs"`` writes the documents in another wording than the evaluation's (no RULER
header, needles ``PAIR_NEEDLE`` and questions ``PAIR_ANSWER``, 7-digit numbers only): a model
trained on it meets RULER's templates, UUID values and multi-key prompts first at test, so NIAH
then measures retrieval learnt from the data, not a format taught (docs/results.md).

Every token is trained on (the loss mask is 1, as for text; ``answer_weight`` > 1 weighs the
answers' value tokens more: with ~8 of them per answer they are ~1-2% of the tokens). The
synthetic sequence of index i is a pure function of (seed, i): resuming or resharding
reproduces it.
"""

from __future__ import annotations

import uuid

import numpy as np

from hwh_jax.data.packing import PackedSequences, segments_and_positions
from hwh_jax.data.ruler import NEEDLE, WORDS, prompt_template, value_type

FORMATS = {  # the documents' wording -> the kinds of value it draws, one per document
    "ruler": ("numbers", "uuids"),  # RULER's niah_single templates: those NIAH asks at test
    "pairs": ("numbers",),  # PAIR_NEEDLE / PAIR_ANSWER: key -> 7-digit number facts
}
PAIR_NEEDLE = "Note: the code of {key} is {value}."
PAIR_ANSWER = "\nQ: What is the code of {key}?\nA: {value}."


class RetrievalMix:
    """``PackedSequences`` text windows followed by ``round(n * share / (1 - share))``
    synthetic retrieval windows: a Grain random-access source whose shuffle mixes them."""

    def __init__(
        self,
        text: PackedSequences,
        tokenizer,
        share: float,
        *,
        max_needles: int = 4,
        answer_weight: float = 1.0,
        fmt: str = "ruler",
        seed: int = 0,
    ):
        if fmt not in FORMATS:
            raise ValueError(f"retrieval format must be one of {list(FORMATS)}, got {fmt!r}")
        if not 0 < share < 1:
            raise ValueError(f"retrieval share must lie in (0, 1), got {share}")
        if answer_weight < 1:
            raise ValueError(f"answer_weight must be >= 1, got {answer_weight}")
        if max_needles < 1:
            raise ValueError(f"max_needles must be >= 1, got {max_needles}")
        self.text, self.tokenizer, self.share, self.seed = text, tokenizer, share, seed
        self.max_needles, self.answer_weight, self.fmt = max_needles, answer_weight, fmt
        self.seq_len, self.window = text.seq_len, text.window
        self.eos_id, self.pad_id = text.eos_id, text.pad_id
        self.num_text = len(text)
        self.num_synthetic = max(1, round(self.num_text * share / (1 - share)))
        self._cache: dict[str, np.ndarray] = {}
        longest = max(WORDS, key=len)
        widest = {"numbers": "9" * 7, "uuids": str(uuid.UUID(int=0))}
        need = 1 + max(
            self._length(self._encode(kind, [longest], [widest[kind]])) for kind in FORMATS[fmt]
        )
        if need >= self.window:
            raise ValueError(
                f"seq_len {self.seq_len} is too short for synthetic retrieval "
                f"sequences: their template alone takes up to {need} tokens"
            )
        if len(text.stream) < 2 * self.window:
            raise ValueError("the training stream is too short to cut haystacks from")

    @staticmethod
    def pieces(
        kind: str, keys: list[str], values: list[str], fmt: str = "ruler"
    ) -> tuple[str, list[str], list[str]]:
        """Header, needles and question-answer texts of one document (k = len(keys)). Each
        question asks for one key's one value, so the template is RULER's singular (as its
        niah_multikey tasks render it with several needles and one query); ``fmt="pairs"``:
        no header, ``PAIR_NEEDLE`` and ``PAIR_ANSWER``."""
        if fmt == "pairs":
            needles = [" " + PAIR_NEEDLE.format(key=k, value=v) + " " for k, v in zip(keys, values)]
            return "", needles, [PAIR_ANSWER.format(key=k, value=v) for k, v in zip(keys, values)]
        header, rest = prompt_template(1).split("{context}")
        one = value_type(kind, 1)
        needles = [
            " " + NEEDLE.format(type_needle_v=kind, key=k, value=v) + " "
            for k, v in zip(keys, values)
        ]
        answers = [rest.format(type_needle_v=one, query=k) + f" {v}." for k, v in zip(keys, values)]
        return header.format(type_needle_v=one), needles, answers

    def __getstate__(self):  # to grain's worker processes: without the fragment cache
        return {k: v for k, v in self.__dict__.items() if k != "_cache"} | {"_cache": {}}

    def _cached(self, text: str) -> np.ndarray:
        """Tokens of a template fragment (header, or the text around a key), encoded once."""
        tokens = self._cache.get(text)
        if tokens is None:
            tokens = self._cache[text] = np.asarray(self.tokenizer.encode(text), np.int32)
        return tokens

    def _encode(self, kind, keys, values):
        """Tokens of the header, needles and answers, and the value spans (start, stop) in each
        needle and answer. Each text is cut just before the space that opens its value; the
        template before the cut is encoded once per (kind, key), the value chunk once per
        needle. Both tokenizers here never merge across that space (tested: the pieces equal
        the whole texts' encodings)."""
        header, needles, answers = self.pieces(kind, keys, values, self.fmt)
        n_parts, a_parts, n_spans, a_spans = [], [], [], []
        for needle, answer, value in zip(needles, answers, values):
            n_value = len(self.tokenizer.encode(" " + value))
            for text, parts, spans in ((needle, n_parts, n_spans), (answer, a_parts, a_spans)):
                cut = text.rindex(" " + value)
                head = self._cached(text[:cut])
                parts.append(
                    np.concatenate([head, np.asarray(self.tokenizer.encode(text[cut:]), np.int32)])
                )
                spans.append((len(head), len(head) + n_value))
        return self._cached(header), n_parts, a_parts, n_spans, a_spans

    @staticmethod
    def _length(parts) -> int:
        """Tokens of header + needles + answers + EOS."""
        header, needles, answers = parts[:3]
        return len(header) + sum(map(len, needles)) + sum(map(len, answers)) + 1

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
        """The j-th synthetic window (inputs, targets, segment_ids, positions, loss_mask); the
        answers' value tokens weigh ``answer_weight`` in the loss, every other token 1."""
        window, answers, _ = self.probe(j)
        if self.answer_weight != 1:
            window["loss_mask"] = 1 + (self.answer_weight - 1) * answers
        return window

    def probe(self, j: int) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
        """The j-th synthetic window, and two target-aligned masks: the value tokens of the
        answers (predictable only by retrieving the needle) and the same values' tokens in the
        needles (unpredictable: the chance baseline). ``hwh_jax.eval.retrieval_probe``."""
        rng = np.random.default_rng((self.seed, 0x5EED, j))
        kinds = FORMATS[self.fmt]
        kind = kinds[int(rng.integers(len(kinds)))]
        k = int(rng.integers(1, self.max_needles + 1))
        keys = [WORDS[int(w)] for w in rng.choice(len(WORDS), k, replace=False)]
        values = [
            str(int(rng.integers(10**6, 10**7)))
            if kind == "numbers"
            else str(uuid.UUID(int=int.from_bytes(rng.bytes(16), "little"), version=4))
            for _ in range(k)
        ]
        order = rng.permutation(k)
        header, needles, answers, n_spans, a_spans = self._encode(kind, keys, values)
        while k > 1 and 4 * self._length((header, needles[:k], answers[:k])) > 3 * self.window:
            k, order = k - 1, order[order != k - 1]  # fewer needles until 3/4 of the window
        needles, answers = needles[:k], answers[:k]
        fixed = self._length((header, needles, answers))
        if fixed > self.window:  # never cut a document silently
            raise ValueError(
                f"synthetic retrieval sequence {j}: template of {fixed} tokens "
                f"exceeds the window of {self.window}"
            )
        hay = int(rng.integers(0, self.window - fixed + 1))
        stream = self.text.stream
        start = int(rng.integers(0, len(stream) - self.window))
        haystack = np.asarray(stream[start : start + hay], np.int32)
        cuts = np.sort(rng.integers(0, hay + 1, k))
        doc, answer_spans, needle_spans = [header], [], []

        def add(tokens, span=None, spans=None):
            at = sum(map(len, doc))
            if span is not None:  # the value's tokens (with the space before it)
                spans.append((at + span[0], at + span[1]))
            doc.append(tokens)

        for n, (a, b) in enumerate(zip(np.concatenate([[0], cuts]), np.concatenate([cuts, [hay]]))):
            add(haystack[a:b])
            if n < k:
                add(needles[n], n_spans[n], needle_spans)
        for n in order:
            add(answers[n], a_spans[n], answer_spans)
        doc = np.concatenate([np.asarray(d, np.int32) for d in doc + [[self.eos_id]]])
        start = int(rng.integers(0, len(stream) - self.window))
        w = np.concatenate(
            [doc, np.asarray(stream[start : start + self.window - len(doc)], np.int32)]
        )
        seg, pos = segments_and_positions(w, self.eos_id, self.window)

        def mask(spans):  # targets[t] = w[t + 1]
            m = np.zeros(self.seq_len, np.float32)
            for lo, hi in spans:
                m[lo - 1 : hi - 1] = 1.0
            return m

        return (
            {
                "inputs": w[:-1],
                "targets": w[1:],
                "segment_ids": seg[:-1],
                "positions": pos[:-1],
                "loss_mask": np.ones(self.seq_len, np.float32),
            },
            mask(answer_spans),
            mask(needle_spans),
        )

    def __repr__(self):
        return (
            f"RetrievalMix({self.num_text} text + {self.num_synthetic} synthetic retrieval "
            f"x {self.seq_len}, share {self.share}, up to {self.max_needles} needles, answer "
            f"weight {self.answer_weight}, format {self.fmt})"
        )
