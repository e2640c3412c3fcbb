"""Attention of a chunk of new queries over a KV cache, block by block (prefill).

Same contract as ``reference.cached_attention`` (the specification, which forms all T x S logits
in fp32 at full precision): here the cache is walked in blocks of ``block`` slots with a running
max and sum (the online softmax of flash attention), so memory is O(T x block) per head, and the
products take the cache's dtype with fp32 accumulation (bf16 tensor cores on a GPU; fp32 inputs
keep full precision). Probabilities are rounded to the values' dtype before p V, as cuDNN's
attention does in training. Only blocks holding a slot that some query of the chunk may see are
visited (``visible_blocks``): a prompt's chunk c over a cache allocated for the whole context
reads the c + 1 chunks' worth of blocks written so far, not the empty rest, so a prefill costs
half the attention work of walking every block. Plain XLA: every backend.

Used for the prefill chunks after a prompt's first (``FullAttentionHeads.extend`` with more than
one new token; a first chunk, ``fresh``, attends over itself through the training attention); a
decode step (one query) keeps the reference.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from kernels_pallas.attention.reference import cache_mask

f32 = jnp.float32


def visible_blocks(k_time, q_time, window, bs: int):
    """(block indices, count): the blocks of ``bs`` slots (k_time [S], S a multiple of bs) that
    hold a slot some query at times ``q_time`` may see (written, not after the latest query, and
    inside the window of the earliest), in cache order, padded with 0 past ``count``. Per-row
    starts (left padding) are not consulted: they only hide more."""
    kt = k_time.reshape(-1, bs)
    seen = (kt >= 0) & (kt <= jnp.max(q_time))
    if window is not None:
        seen &= kt > jnp.min(q_time) - window
    useful = jnp.any(seen, axis=1)
    return jnp.nonzero(useful, size=kt.shape[0], fill_value=0)[0], jnp.sum(useful)


def cached_attention_blockwise(
    q, k, v, *, q_time, k_time, k_start, window=None, scale=None, block: int = 512
):
    """q [B,T,H,D] at times ``q_time`` [T]; k/v [B,S,G,D] at times ``k_time`` [S] (-1 = empty
    slot); ``k_start`` [B]. Key s is visible to query t iff k_start <= k_time[s] <= q_time[t]
    (and, with a window, k_time[s] > q_time[t] - window). A query with no visible key returns
    zeros. Returns [B,T,H,D] in q's dtype."""
    if block < 1:
        raise ValueError(f"cached_attention_blockwise: block must be >= 1, got {block}")
    B, T, H, D = q.shape
    S, G = k.shape[1], k.shape[2]
    R = H // G
    scale = D**-0.5 if scale is None else scale
    cd = k.dtype
    prec = jax.lax.Precision.HIGHEST if cd == f32 else None
    bs = min(block, S)
    pad = (-S) % bs
    if pad:
        k = jnp.pad(k, ((0, 0), (0, pad), (0, 0), (0, 0)))
        v = jnp.pad(v, ((0, 0), (0, pad), (0, 0), (0, 0)))
        k_time = jnp.pad(k_time, (0, pad), constant_values=-1)
    qg = q.reshape(B, T, G, R, D).astype(cd)

    order, count = visible_blocks(k_time, q_time, window, bs)

    def body(i, carry):
        m, l, acc = carry  # [B,G,R,T], [B,G,R,T], [B,G,R,T,D]
        n = order[i]
        kb = jax.lax.dynamic_slice_in_dim(k, n * bs, bs, axis=1)
        vb = jax.lax.dynamic_slice_in_dim(v, n * bs, bs, axis=1)
        kt = jax.lax.dynamic_slice_in_dim(k_time, n * bs, bs)
        s = (
            jnp.einsum("btgrd,bsgd->bgrts", qg, kb, precision=prec, preferred_element_type=f32)
            * scale
        )
        mask = cache_mask(q_time, kt, k_start, window)[:, None, None]  # [B,1,1,T,bs]
        s = jnp.where(mask, s, -jnp.inf)
        m_new = jnp.maximum(m, jnp.max(s, axis=-1))
        base = jnp.where(jnp.isfinite(m_new), m_new, 0.0)  # no key seen yet: any finite base
        p = jnp.exp(s - base[..., None])  # masked entries: exp(-inf) = 0
        corr = jnp.exp(m - base)  # m = -inf (nothing before): 0
        l = l * corr + jnp.sum(p, axis=-1)
        pv = jnp.einsum(
            "bgrts,bsgd->bgrtd", p.astype(v.dtype), vb, precision=prec, preferred_element_type=f32
        )
        return m_new, l, acc * corr[..., None] + pv

    init = (
        jnp.full((B, G, R, T), -jnp.inf, f32),
        jnp.zeros((B, G, R, T), f32),
        jnp.zeros((B, G, R, T, D), f32),
    )
    _, l, acc = jax.lax.fori_loop(0, count, body, init)
    o = jnp.where(l[..., None] > 0, acc / jnp.where(l > 0, l, 1.0)[..., None], 0.0)
    return jnp.transpose(o, (0, 3, 1, 2, 4)).reshape(B, T, H, D).astype(q.dtype)
