"""Retrieval heads over training: each full-attention head's QRscore at every checkpoint of a
run, and the step at which it first reaches a threshold (when the head became a retrieval
head; the formation the hybrid-attention studies follow, e.g. later under larger SWA windows).

The scores come from ``hwh_jax.analysis.run.qr_scores`` (attention mass from the last prompt
position onto the needle value of NIAH prompts); this module only lays them out by head and
finds the crossings (``launch.trace_retrieval`` loads the checkpoints and plots).
"""

from __future__ import annotations

import numpy as np


def trace_table(steps: list[int], scores: list[dict], threshold: float) -> list[dict]:
    """One row per FA head: its layer, head index, score at each of ``steps`` (``scores[i]``:
    {layer: [heads]} at ``steps[i]``) and ``first_step``, the first step whose score is at
    least ``threshold`` (None if none is)."""
    if len(steps) != len(scores) or list(steps) != sorted(steps):
        raise ValueError(f"steps must be increasing, one per score set: {steps}")
    layers = sorted(scores[0]) if scores else []
    rows = []
    for layer in layers:
        series = np.stack([np.asarray(s[layer], np.float64) for s in scores])  # [steps, H]
        for head in range(series.shape[1]):
            above = np.flatnonzero(series[:, head] >= threshold)
            rows.append(
                {
                    "layer": int(layer),
                    "head": head,
                    "scores": [round(float(v), 6) for v in series[:, head]],
                    "first_step": int(steps[above[0]]) if len(above) else None,
                }
            )
    return rows
