"""Per-chunk algebra shared by the chunked kernels' bodies (values inside a kernel, G the chunk-
local cumulative log decay as a [C, 1] column, or as a [1, C] row from ``chunk_rows``; G None:
no decay, DeltaNet's delta rule)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from kernels_pallas.linear_scan.common import dot, dot_nt, f32


def last_row(G):
    """(is-last-row mask [C, 1], G_last [1, 1]) of a [C, 1] column (no value slicing: Triton)."""
    last = jax.lax.broadcasted_iota(jnp.int32, G.shape, 0) == G.shape[0] - 1
    return last, jnp.sum(jnp.where(last, G, 0.0), axis=0, keepdims=True)


def colsum(M):
    """Column sums of a square tile as a [C, 1] column, without transposing the tile."""
    rows = jax.lax.broadcasted_iota(jnp.int32, M.shape, 0)
    cols = jax.lax.broadcasted_iota(jnp.int32, M.shape, 1)
    return jnp.sum(
        jnp.where(rows == cols, jnp.sum(M, axis=0, keepdims=True), 0.0), axis=1, keepdims=True
    )


def times(x, d):
    """x * d, or x where there is no factor (d None: no decay)."""
    return x if d is None else x * d


def q_decayed(q, G, scale=1.0):
    """qd = q e^G (q's dtype), times ``scale``; G is a [C, 1] column (None: no decay)."""
    if G is None:
        return q if scale == 1.0 else (q.astype(f32) * scale).astype(q.dtype)
    return (q.astype(f32) * (jnp.exp(G) if scale == 1.0 else scale * jnp.exp(G))).astype(q.dtype)


def k_decayed(k, G):
    """kd = k e^{G_last - G} (k's dtype) and e^{G_last} [1, 1] (G None: k and None)."""
    if G is None:
        return k, None
    _, g_last = last_row(G)
    return (k.astype(f32) * jnp.exp(g_last - G)).astype(k.dtype), jnp.exp(g_last)


def causal_decay(Gc, Gr):
    """E [C, C] fp32: e^{G_i - G_j} for j <= i, else 0 (masked before exp: every exponent <= 0),
    from a chunk's G as a column [C, 1] and as a row [1, C]."""
    C = Gc.shape[0]
    lower = jax.lax.broadcasted_iota(jnp.int32, (C, C), 0) >= jax.lax.broadcasted_iota(
        jnp.int32, (C, C), 1
    )
    return jnp.where(lower, jnp.exp(jnp.where(lower, Gc - Gr, 0.0)), 0.0)


def decayed_scores(q, k, Gc, Gr):
    """QK = (q k^T) * E [C, C] fp32 of one chunk (``causal_decay``)."""
    return dot_nt(q, k) * causal_decay(Gc, Gr)


def chunk_rows(G, chunk_size):
    """G [B, N*C, H] -> [B, N, H, 1, C]: each chunk's G as a row, a per-chunk input of
    ``chunk_call`` (beside G [B, T, H, 1] as columns)."""
    B, T, H = G.shape
    return G.reshape(B, T // chunk_size, chunk_size, H).transpose(0, 1, 3, 2)[:, :, :, None, :]


def chunk_output(q, qk, G, S, v, q_scale=1.0):
    """o = (q_scale q e^G) S + QK v of one chunk, S and v in q's dtype (QK already scaled)."""
    return dot(q_decayed(q, G, q_scale), S) + dot(qk, v)
