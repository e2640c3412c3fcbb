"""RoPE-decomposed attention logits, and the frequency-intervention scores RFIS and RPD.

For layer l, query head h (kv head g(h) = h // q_per_kv), query position i, key j <= i and
frequency group r (w_r = the head's RoPE angular frequency; r = 0 is the highest):

    c[i, j, r]  = q_{i,r}^T R((j - i) w_r) k_{j,r}      exact contribution of group r
    c0[i, j, r] = q_{i,r}^T k_{j,r}                     the same pair, rotation removed
    z_i = scale * sum_r c[i, ., r]                      the model's own logits (softmax = p_i)
    RFIS[h, r] = E_x E_i JS(p_i, softmax(z_i - scale c[i, ., r])) / ln 2
    RPD[h, r]  = E_x E_i JS(p_i, softmax(z_i - scale c[i, ., r] + scale c0[i, ., r])) / ln 2

q and k are taken after any q/k norm and before rotation. With the pair (a1, a2) of group r,
q^T R(t) k = cos t (q1 k1 + q2 k2) + sin t (q2 k1 - q1 k2). Scores are computed one query at a
time (``jax.vmap`` over a chunk of queries, ``lax.map`` over chunks and samples), so memory is
O(chunk x heads x F x T), never [H, T, T, F].
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from hwh_jax.layers.rope import split_pairs

_HI = jax.lax.Precision.HIGHEST


def _pairs(x, pairing):
    a, b = split_pairs(x.astype(jnp.promote_types(x.dtype, jnp.float32)), pairing)
    return a, b  # [..., F] each


def contributions(
    q, k, frequencies, *, q_per_kv: int = 1, pairing: str = "half", q_pos=None, k_pos=None
):
    """c, c0 [H, Tq, Tk, F] for one sample: q [Tq, H, D], k [Tk, G, D] (pre-rotation).

    Small inputs only (tests, single queries): the scores below never build this tensor."""
    Tq, Tk = q.shape[0], k.shape[0]
    q_pos = jnp.arange(Tq) if q_pos is None else q_pos
    k_pos = jnp.arange(Tk) if k_pos is None else k_pos
    k = jnp.repeat(k, q_per_kv, axis=1)  # [Tk, H, D]
    q1, q2 = _pairs(q, pairing)
    k1, k2 = _pairs(k, pairing)
    c0 = jnp.einsum("ihr,jhr->hijr", q1, k1, precision=_HI) + jnp.einsum(
        "ihr,jhr->hijr", q2, k2, precision=_HI
    )
    s = jnp.einsum("ihr,jhr->hijr", q2, k1, precision=_HI) - jnp.einsum(
        "ihr,jhr->hijr", q1, k2, precision=_HI
    )
    angle = (k_pos[None, :] - q_pos[:, None]).astype(frequencies.dtype)[
        None, :, :, None
    ] * frequencies
    return jnp.cos(angle) * c0 + jnp.sin(angle) * s, c0


def _js_bits(p, q, mask):
    """JS(p, q) / ln 2 over the last axis (masked entries are 0 in both)."""
    m = 0.5 * (p + q)
    kl = lambda a: jnp.sum(
        jnp.where(mask, jax.scipy.special.xlogy(a, a) - jax.scipy.special.xlogy(a, m), 0.0), -1
    )
    return jnp.clip(0.5 * (kl(p) + kl(q)) / jnp.log(jnp.asarray(2.0, p.dtype)), 0.0, 1.0)


def _query_scores(qi, i, k1, k2, k_pos, frequencies, scale, q_per_kv, pairing):
    """JS(p, p^(-r)) and JS(p, p^(r->0)) [H, F] for one query qi [H, D] at position i."""
    q1, q2 = _pairs(qi, pairing)  # [H, F]
    g = jnp.arange(qi.shape[0]) // q_per_kv
    kk1, kk2 = k1[:, g], k2[:, g]  # [Tk, H, F]
    c0 = q1[None] * kk1 + q2[None] * kk2  # [Tk, H, F]
    s = q2[None] * kk1 - q1[None] * kk2
    angle = (k_pos - i).astype(frequencies.dtype)[:, None, None] * frequencies
    c = jnp.cos(angle) * c0 + jnp.sin(angle) * s
    c, c0 = jnp.moveaxis(c, 0, -1), jnp.moveaxis(c0, 0, -1)  # [H, F, Tk]
    mask = (k_pos <= i)[None, None, :]
    z = scale * c.sum(1, keepdims=True)  # [H, 1, Tk]

    def softmax(x):
        return jax.nn.softmax(jnp.where(mask, x, -jnp.inf), axis=-1, where=mask) * mask

    p = softmax(z)
    minus = z - scale * c
    return _js_bits(p, softmax(minus), mask), _js_bits(p, softmax(minus + scale * c0), mask)


@functools.partial(jax.jit, static_argnames=("q_per_kv", "pairing", "chunk"))
def rfis_rpd(
    q,
    k,
    query_idx,
    frequencies,
    *,
    scale,
    q_per_kv: int = 1,
    pairing: str = "half",
    chunk: int = 16,
):
    """RFIS and RPD [H, F] of one layer, averaged over samples and their sampled queries.

    Args:
      q: [N, T, H, D], k: [N, T, G, D] per-layer q/k of N samples (pre-rotation, post-norm).
      query_idx: [N, Q] int query positions per sample (the nested expectation weighs every
        sample equally: mean over its Q queries, then over samples).
      frequencies: [F] the heads' RoPE frequencies; scale: the logit scale (e.g. D**-0.5).
    """
    N, T = q.shape[:2]
    Q = query_idx.shape[1]
    pad = (-Q) % chunk
    idx = jnp.pad(query_idx, ((0, 0), (0, pad)))
    valid = jnp.arange(Q + pad) < Q
    k_pos = jnp.arange(T)
    one = functools.partial(
        _query_scores, frequencies=frequencies, scale=scale, q_per_kv=q_per_kv, pairing=pairing
    )

    def per_sample(args):
        qs, ks, ids = args
        k1, k2 = _pairs(ks, pairing)

        def per_chunk(c):
            i = jax.lax.dynamic_slice_in_dim(ids, c * chunk, chunk)
            return jax.vmap(lambda ii: one(qs[ii], ii, k1, k2, k_pos))(i)

        a, b = jax.lax.map(per_chunk, jnp.arange((Q + pad) // chunk))
        a, b = a.reshape(Q + pad, *a.shape[2:]), b.reshape(Q + pad, *b.shape[2:])
        w = valid[:, None, None] / Q
        return (a * w).sum(0), (b * w).sum(0)

    a, b = jax.lax.map(per_sample, (q, k, idx))
    return a.mean(0), b.mean(0)


def sample_queries(rng, num_samples: int, seq_len: int, num_queries: int, min_pos: int = 1):
    """[N, Q] sorted query positions per sample, uniform without replacement in [min_pos, T)."""
    import numpy as np

    if not 0 <= min_pos < seq_len or num_queries > seq_len - min_pos:
        raise ValueError(f"cannot sample {num_queries} queries from [{min_pos}, {seq_len})")
    return np.stack(
        [
            np.sort(rng.choice(np.arange(min_pos, seq_len), num_queries, replace=False))
            for _ in range(num_samples)
        ]
    ).astype(np.int32)
