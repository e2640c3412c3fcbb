"""LongPPL (Fang et al., 2024, "What is wrong with perplexity for long-context language
modeling?"): perplexity on the tokens that need a long context.

An evaluator model scores every token of a long window twice: with the whole window before it
(LCL, the long-context log-probability) and with only its last ``short`` tokens before it; the
difference is LSD. Key tokens are those with LSD > alpha (the long context helps) and LCL > beta
(the evaluator predicts them well with it); the paper's alpha = 2, beta = -2. LongPPL of a model
is its perplexity over the key tokens, each scored with the whole window before it. The
evaluator may be the model itself or another (any checkpoint with the same tokenizer).

The short context: a token at window position p (predicted from tokens 0..p) is scored from all
of them while p < ``short``; later, from sub-windows of ``short`` + 1 tokens starting every
``stride`` tokens, so its context holds between ``short - stride + 1`` and ``short`` tokens
(it starts at s(p) = stride * ((p - short) // stride + 1)).
"""

from __future__ import annotations

import math

import numpy as np


def window_logprobs(scorer, windows: np.ndarray) -> np.ndarray:
    """[n, L] log p(window[:, p + 1] | window[:, :p + 1]) of windows [n, L + 1]."""
    out = []
    for i in range(0, len(windows), scorer.batch_size):
        part = windows[i : i + scorer.batch_size]
        batch = np.zeros((scorer.batch_size, windows.shape[1]), np.int32)
        batch[: len(part)] = part
        out.append(scorer.token_logprobs(batch)[0][: len(part)])
    return np.concatenate(out)


def short_context_logprobs(
    scorer, windows: np.ndarray, *, short: int, stride: int, long_lp: np.ndarray | None = None
) -> np.ndarray:
    """[n, L] log-probabilities of the same tokens as ``window_logprobs``, each from at most
    ``short`` tokens of context (the module's docstring says which). ``long_lp``: the same
    scorer's ``window_logprobs`` of ``windows`` if at hand (the first ``short`` positions are
    theirs)."""
    n, L = windows.shape[0], windows.shape[1] - 1
    if not 0 < stride <= short:
        raise ValueError(f"LongPPL: stride {stride} must be in [1, short={short}]")
    out = np.empty((n, L), np.float32)
    head = min(short, L)
    out[:, :head] = (
        long_lp if long_lp is not None else window_logprobs(scorer, windows[:, : head + 1])
    )[:, :head]
    starts = list(range(stride, max(L - short + stride, stride), stride)) if L > short else []
    if starts:
        padded = np.pad(windows, [(0, 0), (0, short + stride)])
        subs = np.stack([padded[:, s : s + short + 1] for s in starts], 1)  # [n, J, short + 1]
        lp = window_logprobs(scorer, subs.reshape(-1, short + 1)).reshape(n, len(starts), short)
        for j, s in enumerate(starts):  # positions s + short - stride .. s + short - 1
            lo, hi = s + short - stride, min(s + short, L)
            out[:, lo:hi] = lp[:, j, short - stride : short - stride + hi - lo]
    return out


def key_tokens(
    long_lp: np.ndarray, short_lp: np.ndarray, *, alpha: float = 2.0, beta: float = -2.0
) -> np.ndarray:
    """Bool mask of the key tokens: LSD = long_lp - short_lp > alpha and LCL = long_lp > beta."""
    return (long_lp - short_lp > alpha) & (long_lp > beta)


def evaluate_longppl(
    scorer,
    evaluator,
    stream: np.ndarray,
    *,
    length: int,
    short: int,
    stride: int,
    alpha: float = 2.0,
    beta: float = -2.0,
    max_windows: int = 16,
    bucket: int = 0,
    log=print,
) -> dict:
    """LongPPL of ``scorer``'s model on windows of ``length`` tokens of ``stream``, key tokens
    chosen by ``evaluator`` (a Scorer, possibly the same); with the plain perplexity of the same
    windows, and per position bucket the key tokens and both losses."""
    n = min(max_windows, (len(stream) - 1) // length)
    if n < 1:
        raise ValueError(f"LongPPL: {len(stream)} held-out tokens hold no window of {length + 1}")
    if short >= length:
        raise ValueError(f"LongPPL: short context {short} must be below the window {length}")
    windows = np.stack([stream[i * length : (i + 1) * length + 1] for i in range(n)])
    model_lp = window_logprobs(scorer, windows)
    long_lp = model_lp if evaluator is scorer else window_logprobs(evaluator, windows)
    short_lp = short_context_logprobs(
        evaluator, windows, short=short, stride=stride, long_lp=long_lp
    )
    key = key_tokens(long_lp, short_lp, alpha=alpha, beta=beta)
    bucket = bucket or short
    rows = []
    for s in range(0, length, bucket):
        k, part = key[:, s : s + bucket], model_lp[:, s : s + bucket]
        rows.append(
            {
                "start": s,
                "end": min(s + bucket, length),
                "key_tokens": int(k.sum()),
                "tokens": int(part.size),
                "loss": float(-part.mean()),
                "key_loss": float(-part[k].mean()) if k.any() else None,
            }
        )
    loss = float(-model_lp.mean())
    key_loss = float(-model_lp[key].mean()) if key.any() else None
    result = {
        "longppl": math.exp(min(key_loss, 50)) if key_loss is not None else None,
        "key_loss": key_loss,
        "ppl": math.exp(min(loss, 50)),
        "loss": loss,
        "key_tokens": int(key.sum()),
        "tokens": int(key.size),
        "windows": n,
        "max_gain": float((long_lp - short_lp).max()),  # the largest LSD, nats
        "length": length,
        "short": short,
        "stride": stride,
        "alpha": alpha,
        "beta": beta,
        "by_position": rows,
    }
    where = f"(PPL {result['ppl']:.2f}); windows of {length}, short context {short}"
    if key_loss is None:
        log(
            f"LongPPL undefined: no key token among {result['tokens']} (the long context gains "
            f"at most {result['max_gain']:.2f} nats on a token, a key token needs {alpha} with a "
            f"log-prob above {beta}) {where}"
        )
    else:
        log(
            f"LongPPL {result['longppl']:.2f} over {result['key_tokens']} key tokens of "
            f"{result['tokens']} {where}"
        )
    return result
