"""Softmax attention in plain XLA: the specification of ``kernels_pallas.attention``.

    O_h = softmax(scale * Q_h K_g(h)^T + M) V_g(h),   g(h) = h // (H / G)   (GQA)

M masks keys after the query (causal), keys more than ``window - 1`` positions back (sliding
window: keys in [t - w + 1, t]) and keys of another document (segment ids). Logits and softmax
in fp32; a query row with no visible key (impossible when causal) would return zeros.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

_HI = jax.lax.Precision.HIGHEST


def attention_mask(T_q, T_k, *, causal=True, window=None, q_offset=0):
    """[T_q, T_k] bool, True where query i (absolute position q_offset + i) may see key j."""
    qi = jnp.arange(T_q)[:, None] + q_offset
    kj = jnp.arange(T_k)[None, :]
    mask = jnp.ones((T_q, T_k), bool)
    if causal:
        mask &= kj <= qi
    if window is not None:
        mask &= kj > qi - window
    return mask


def same_segment(q_segment_ids, kv_segment_ids):
    """[B, T] and [B, S] segment ids -> [B, 1, T, S] bool: whether query t and key s are in one
    document (None without segment ids)."""
    if q_segment_ids is None:
        return None
    return (q_segment_ids[:, :, None] == kv_segment_ids[:, None, :])[:, None]


def attention_reference(
    q,
    k,
    v,
    *,
    causal=True,
    window=None,
    scale=None,
    segment_ids=None,
    q_offset=None,
    kv_segment_ids=None,
):
    """q [B,T,H,D], k/v [B,S,G,D] -> [B,T,H,D] in q's dtype; segment_ids [B,T] (T == S).

    ``q_offset``: the position of the first query among the keys (default S - T: the queries
    are the last T; a traced value is allowed), with ``kv_segment_ids`` [B, S] the keys'
    segments when they are not the queries' (a time shard's queries over all the keys)."""
    B, T, H, D = q.shape
    S, G = k.shape[1], k.shape[2]
    scale = D**-0.5 if scale is None else scale
    qg = q.reshape(B, T, G, H // G, D).astype(jnp.float32)
    logits = jnp.einsum("btgrd,bsgd->bgrts", qg, k.astype(jnp.float32), precision=_HI) * scale
    q_offset = S - T if q_offset is None else q_offset
    mask = attention_mask(T, S, causal=causal, window=window, q_offset=q_offset)[None, None, None]
    if segment_ids is not None:
        kv_seg = segment_ids if kv_segment_ids is None else kv_segment_ids
        mask = mask & same_segment(segment_ids, kv_seg)[:, :, None]
    logits = jnp.where(mask, logits, -jnp.inf)
    p = jax.nn.softmax(logits, axis=-1, where=mask)
    p = jnp.where(mask, p, 0.0)
    o = jnp.einsum("bgrts,bsgd->btgrd", p, v.astype(jnp.float32), precision=_HI)
    return o.reshape(B, T, H, D).astype(q.dtype)


def attention_blocked(
    q,
    k,
    v,
    *,
    block_q=1024,
    causal=True,
    window=None,
    scale=None,
    segment_ids=None,
    q_offset=None,
    kv_segment_ids=None,
):
    """``attention_reference`` over blocks of ``block_q`` queries, one block at a time
    (``lax.map``), each recomputed in the backward (``jax.checkpoint``): a block's scores are
    [B, H, block_q, S] where the reference holds [B, H, T, S] (8 x 16 heads x 8,192^2 in fp32
    is 34 GiB, its gradient about twice that). The same math a row; every key of every block is
    scored, masked ones included. Fewer than two blocks' queries, or T not a multiple of
    ``block_q``: the reference itself. Arguments as ``attention_reference``'s."""
    B, T, H, D = q.shape
    S = k.shape[1]
    if block_q < 1:
        raise ValueError(f"attention_blocked: block_q must be >= 1, got {block_q}")
    kw = dict(causal=causal, window=window, scale=scale)
    if T <= block_q or T % block_q:
        return attention_reference(
            q, k, v, segment_ids=segment_ids, q_offset=q_offset, kv_segment_ids=kv_segment_ids,
            **kw,
        )  # fmt: skip
    n = T // block_q
    first = S - T if q_offset is None else q_offset
    kv_seg = segment_ids if kv_segment_ids is None else kv_segment_ids
    blocks = q.reshape(B, n, block_q, H, D).swapaxes(0, 1)  # [n, B, block_q, H, D]
    segs = None if segment_ids is None else segment_ids.reshape(B, n, block_q).swapaxes(0, 1)

    @jax.checkpoint
    def one(xs):
        i, qi, si = xs
        return attention_reference(
            qi, k, v, segment_ids=si, q_offset=first + i * block_q, kv_segment_ids=kv_seg, **kw
        )

    o = jax.lax.map(one, (jnp.arange(n), blocks, segs))
    return o.swapaxes(0, 1).reshape(B, T, H, D)


def cache_mask(q_time, k_time, k_start, window=None):
    """[B, T, S] bool: key s (at time k_time[s], -1 = empty slot) visible to query t (at
    q_time[t]) of row b iff k_start[b] <= k_time[s] <= q_time[t] (and, with a window,
    k_time[s] > q_time[t] - window)."""
    kt, qt = k_time[None, None, :], q_time[None, :, None]
    mask = (kt >= 0) & (kt <= qt) & (kt >= k_start[:, None, None])
    if window is not None:
        mask &= kt > qt - window
    return mask


def cached_attention(q, k, v, *, q_time, k_time, k_start, window=None, scale=None):
    """Attention of new queries over a KV cache whose slots carry absolute times.

    q [B,T,H,D] at times ``q_time`` [T]; k/v [B,S,G,D] at times ``k_time`` [S] (-1 = empty
    slot); ``k_start`` [B]: the first time that belongs to each row (left padding before it).
    Key s is visible to query t iff k_start <= k_time[s] <= q_time[t] (and, with a window,
    k_time[s] > q_time[t] - window). A query with no visible key returns zeros.
    """
    B, T, H, D = q.shape
    G = k.shape[2]
    scale = D**-0.5 if scale is None else scale
    qg = q.reshape(B, T, G, H // G, D).astype(jnp.float32)
    logits = jnp.einsum("btgrd,bsgd->bgrts", qg, k.astype(jnp.float32), precision=_HI) * scale
    mask = cache_mask(q_time, k_time, k_start, window)[:, None, None]
    p = jax.nn.softmax(jnp.where(mask, logits, -jnp.inf), axis=-1, where=mask)
    p = jnp.where(mask, p, 0.0)
    o = jnp.einsum("bgrts,bsgd->btgrd", p, v.astype(jnp.float32), precision=_HI)
    return o.reshape(B, T, H, D).astype(q.dtype)
