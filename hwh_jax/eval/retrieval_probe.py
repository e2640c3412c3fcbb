"""Retrieval probe: does the model copy a needle's value when asked for it, in the format it
was trained on? A cheap, teacher-forced check (one forward pass per batch, no generation) that
separates "cannot retrieve" from "cannot transfer to NIAH's haystacks and lengths".

Documents are ``RetrievalMix`` synthetic documents (``hwh_jax/data/retrieval.py``: in
``fmt``'s wording, RULER's templates by default, 1-4 needles, every one asked for) cut from the
*held-out* token stream, at the run's training length. For the value tokens of the answers
(predictable only by retrieving the needle) and, as the chance baseline, for the same values'
tokens in the needles: mean log-loss per token and teacher-forced greedy accuracy; and the
share of answers whose every value token is the model's argmax ("exact").
"""

from __future__ import annotations

import numpy as np

from hwh_jax.data.packing import PackedSequences
from hwh_jax.data.retrieval import RetrievalMix


def _runs(mask: np.ndarray):
    """(start, stop) of the runs of ones in a 0/1 vector."""
    edges = np.diff(np.concatenate([[0], mask.astype(np.int8), [0]]))
    return list(zip(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)))


def retrieval_probe(
    scorer,
    tokenizer,
    stream: np.ndarray,
    seq_len: int,
    *,
    num: int = 64,
    fmt: str = "ruler",
    log=print,
) -> dict:
    if num < 1:
        raise ValueError(f"retrieval probe: num must be >= 1, got {num}")
    text = PackedSequences(stream, seq_len, eos_id=tokenizer.eos_id, pad_id=tokenizer.pad_id)
    mix = RetrievalMix(text, tokenizer, 0.5, fmt=fmt)
    nll = {"answer": [], "needle": []}
    hit = {"answer": [], "needle": []}
    exact = []
    for lo in range(0, num, scorer.batch_size):
        docs = [mix.probe(j) for j in range(lo, min(lo + scorer.batch_size, num))]
        n = len(docs)
        docs += [docs[-1]] * (scorer.batch_size - n)  # one batch shape
        tokens = np.stack([np.concatenate([x["inputs"], x["targets"][-1:]]) for x, _, _ in docs])
        lp, greedy = scorer.token_logprobs(tokens)
        for (x, answer, needle), l, g in zip(docs[:n], lp[:n], greedy[:n]):
            for name, m in (("answer", answer), ("needle", needle)):
                nll[name].append(-l[m > 0])
                hit[name].append(g[m > 0])
            exact += [bool(g[a:b].all()) for a, b in _runs(answer)]
    out = {"format": fmt, "documents": num, "answers": len(exact), "exact": float(np.mean(exact))}
    for name in nll:
        out[f"{name}_nll"] = float(np.concatenate(nll[name]).mean())
        out[f"{name}_accuracy"] = float(np.concatenate(hit[name]).mean())
    log(
        f"retrieval probe ({fmt} wording, {num} documents, {len(exact)} answers): answer tokens loss "
        f"{out['answer_nll']:.3f} / accuracy {out['answer_accuracy']:.3f} vs needle tokens "
        f"(chance) {out['needle_nll']:.3f} / {out['needle_accuracy']:.3f}; exact answers "
        f"{out['exact']:.3f}"
    )
    return out
