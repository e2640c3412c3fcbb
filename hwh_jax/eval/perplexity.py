"""Perplexity by position: does the loss keep falling, or blow up, past the training length?

Held-out text is cut into windows of ``max_len`` tokens (e.g. 4x the training length), each
window is scored in one causal pass from position 0, and the per-token losses are averaged per
position bucket over windows. A model that extrapolates keeps a flat or falling curve beyond
the training length; RoPE attention typically rises sharply there.
"""

from __future__ import annotations

import math

import numpy as np

from hwh_jax.progress import Progress


def ppl_by_position(
    scorer, stream: np.ndarray, *, max_len: int, bucket: int, max_windows: int = 64, log=print
) -> list[dict]:
    """Rows {start, end, loss, ppl, tokens} per bucket of positions [start, end)."""
    if max_len % bucket:
        raise ValueError(
            f"ppl_by_position: max_len {max_len} must be a multiple of bucket {bucket}"
        )
    n = min(max_windows, (len(stream) - 1) // max_len)
    if n < 1:
        raise ValueError(
            f"ppl_by_position: {len(stream)} held-out tokens hold no window of {max_len + 1}"
        )
    windows = np.stack([stream[i * max_len : (i + 1) * max_len + 1] for i in range(n)])
    losses = []
    with Progress(n, f"perplexity by position ({max_len:,} tokens)", unit="window") as p:
        for i in range(0, n, scorer.batch_size):
            part = windows[i : i + scorer.batch_size]
            tokens = np.zeros((scorer.batch_size, max_len + 1), np.int32)
            tokens[: len(part)] = part
            lp, _ = scorer.token_logprobs(tokens)
            losses.append(-lp[: len(part)])
            p.update(len(part))
    per_window = np.concatenate(losses)  # [n, max_len]: token t+1
    rows = []
    for s in range(0, max_len, bucket):
        # the unit is the window (a stretch of held-out text): the bucket's mean loss in each,
        # and a normal 95% interval of their mean (none from one window)
        means = per_window[:, s : s + bucket].mean(1)
        loss = float(means.mean())
        half = 1.96 * float(means.std(ddof=1)) / math.sqrt(n) if n > 1 else float("nan")
        rows.append(
            {
                "start": s,
                "end": s + bucket,
                "loss": loss,
                "ppl": math.exp(min(loss, 50)),
                "tokens": int(n * bucket),
                "windows": n,
                "ppl_lo": math.exp(min(loss - half, 50)) if n > 1 else None,
                "ppl_hi": math.exp(min(loss + half, 50)) if n > 1 else None,
            }
        )
    log("ppl by position: " + ", ".join(f"[{r['start']},{r['end']}) {r['ppl']:.1f}" for r in rows))
    return rows
