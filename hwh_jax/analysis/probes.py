"""Behavioural probes of heads from their attention rows: QRscore and LDscore.

    QRscore_h = E_samples E_{i in answer positions} sum_{j in needle} p_h[i, j]
        (retrieval tendency: attention mass from the answer onto the evidence tokens)
    LDscore_h = E_i  sum_{j in [i-w+1, i], j >= sink} p_h[i, j] / sum_{j >= sink} p_h[i, j]
        (local streaming tendency: share of the non-sink mass within the last w tokens)

Attention rows are recomputed from captured q/k (rotated when the heads use RoPE) with the
model's own scale, causal mask and GQA mapping, for the requested query positions only.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from hwh_jax.layers.rope import apply_rope


def attention_rows(
    q,
    k,
    query_idx,
    frequencies,
    *,
    rope: bool,
    scale: float,
    q_per_kv: int = 1,
    pairing: str = "half",
):
    """p [H, Q, T] of one sample: q [T, H, D], k [T, G, D], query_idx [Q]."""
    T = q.shape[0]
    pos = jnp.arange(T)
    if rope:
        q = apply_rope(q[None], pos, pairing=pairing, frequencies=frequencies)[0]
        k = apply_rope(k[None], pos, pairing=pairing, frequencies=frequencies)[0]
    k = jnp.repeat(k, q_per_kv, axis=1).astype(jnp.float32)
    qi = q[query_idx].astype(jnp.float32)  # [Q, H, D]
    logits = jnp.einsum("qhd,thd->hqt", qi, k, precision=jax.lax.Precision.HIGHEST) * scale
    mask = (pos[None, :] <= query_idx[:, None])[None]
    return jax.nn.softmax(jnp.where(mask, logits, -jnp.inf), axis=-1, where=mask) * mask


def qr_score(rows, needle_mask):
    """[H]: mean over the rows' queries of the mass on needle tokens; rows [H, Q, T]."""
    return (rows * needle_mask[None, None, :]).sum(-1).mean(-1)


def ld_score(rows, query_idx, *, window: int, sink: int = 1):
    """[H]: mean over queries of the non-sink mass share within the last ``window`` tokens."""
    T = rows.shape[-1]
    j = jnp.arange(T)[None, :]
    i = query_idx[:, None]
    local = ((j > i - window) & (j <= i) & (j >= sink))[None]
    non_sink = (j >= sink)[None]
    return ((rows * local).sum(-1) / jnp.maximum((rows * non_sink).sum(-1), 1e-12)).mean(-1)
