"""The short causal convolution of the GDN heads, with its SiLU and per-head L2 norm, in jnp.

    y_t = SiLU( sum_i w_i x_{t-(W-1)+i} )          depthwise over the channels, width W
    y_t = y_t / sqrt(|y_t|^2 + eps)                per head of ``C / heads`` channels (optional)

A tap that would reach across a document boundary (a change of segment id between its input
and the current token) contributes nothing. This is the specification and the CPU path; the
Pallas kernels in ``pallas.py`` compute the same in one pass over x forward and one backward.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def doc_offsets(segment_ids, B: int, T: int):
    """Tokens since the current document began, [B, T] int32 (t itself without segment ids).
    A document begins at t = 0 and wherever the segment id changes, as the GDN recurrence's
    reset does."""
    t = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
    if segment_ids is None:
        return t
    start = jnp.concatenate(
        [jnp.ones((B, 1), bool), segment_ids[:, 1:] != segment_ids[:, :-1]], axis=1
    )
    return t - jax.lax.cummax(jnp.where(start, t, 0), axis=1)


def causal_conv1d(x, weight, segment_ids=None):
    """Depthwise causal conv: y_t = sum_i weight[i] * x_{t - (W-1) + i}; x [B,T,C], weight [W,C],
    in x's dtype. With segment ids, tap i is dropped where the document is younger than its lag
    W-1-i."""
    W = weight.shape[0]
    B, T = x.shape[:2]
    xp = jnp.pad(x, ((0, 0), (W - 1, 0), (0, 0)))
    if segment_ids is not None:
        since = doc_offsets(segment_ids, B, T)
    y = jnp.zeros_like(x)
    for i in range(W):
        tap = xp[:, i : i + T] * weight[i].astype(x.dtype)
        if segment_ids is not None and i < W - 1:
            tap = jnp.where((since >= W - 1 - i)[..., None], tap, 0)
        y = y + tap
    return y


def l2_normalize(x, eps=1e-6, scale=1.0):
    """x / sqrt(|x|^2 + eps) over the last axis, times ``scale``, in fp32, cast to x's dtype."""
    x32 = x.astype(jnp.float32)
    r = jax.lax.rsqrt(jnp.sum(x32 * x32, -1, keepdims=True) + eps)
    return (x32 * (r * scale if scale != 1.0 else r)).astype(x.dtype)


def silu_norm(z, *, heads: int = 1, normalize: bool = False, eps: float = 1e-6, scale: float = 1.0):
    """What follows the convolution: SiLU(z) [B, T, C], L2-normalised per head of C // heads
    and times ``scale`` if ``normalize`` (also the GDN heads' one-token ``extend``)."""
    y = jax.nn.silu(z)
    if not normalize:
        return y
    B, T, C = y.shape
    return l2_normalize(y.reshape(B, T, heads, C // heads), eps, scale).reshape(B, T, C)


def short_conv_reference(
    x,
    weight,
    segment_ids=None,
    *,
    heads: int = 1,
    normalize: bool = False,
    eps: float = 1e-6,
    scale: float = 1.0,
):
    """SiLU(causal_conv1d(x)) [B, T, C], L2-normalised per head of C // heads and times
    ``scale`` if ``normalize``."""
    return silu_norm(
        causal_conv1d(x, weight, segment_ids),
        heads=heads,
        normalize=normalize,
        eps=eps,
        scale=scale,
    )
