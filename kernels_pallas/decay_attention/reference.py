"""Gated linear attention, token by token: the specification the chunked form is checked
against. For each token t of one head, with the state ``h`` [K, V] (fla's layout, S^T):

    h   <- diag(exp(g_t)) h + k_t v_t^T       # decay per key dimension, then write
    o_t  = h^T (scale * q_t)                  # read

``g_t`` is the log decay (<= 0): per key dimension, or one value per head (a scalar decay,
the same in every key dimension). All arithmetic is fp32; outputs in v's dtype.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

_HI = jax.lax.Precision.HIGHEST


def per_key(g, K: int, token_axis: bool):
    """The log decay as [..., H, K] fp32 from [B, (T,) H] (scalar) or [B, (T,) H, K]."""
    scalar = g.ndim == (3 if token_axis else 2)
    g = g.astype(jnp.float32)
    return jnp.broadcast_to(g[..., None], (*g.shape, K)) if scalar else g


def decay_attention_step(q_t, k_t, v_t, g_t, state, *, scale=None):
    """One decode step.

    Args:
      q_t, k_t: [B, H, K]; v_t: [B, H, V]; g_t: [B, H] or [B, H, K]; state [B, H, K, V] fp32.
      scale: query scale, default K**-0.5.
    Returns:
      (o_t [B, H, V] in v_t's dtype, new state [B, H, K, V] fp32).
    """
    K = q_t.shape[-1]
    scale = K**-0.5 if scale is None else scale
    f32 = jnp.float32
    g = per_key(g_t, K, token_axis=False)
    h = state.astype(f32) * jnp.exp(g)[..., None]
    h = h + k_t.astype(f32)[..., :, None] * v_t.astype(f32)[..., None, :]
    o = jnp.einsum("bhkv,bhk->bhv", h, q_t.astype(f32) * scale, precision=_HI)
    return o.astype(v_t.dtype), h


def decay_attention_recurrent(
    q, k, v, g, *, scale=None, initial_state=None, output_final_state=False
):
    """``lax.scan`` over tokens of :func:`decay_attention_step`.

    Shapes as fla: q, k [B, T, H, K]; v [B, T, H, V]; g [B, T, H] or [B, T, H, K]; state
    [B, H, K, V]. Returns (o [B, T, H, V], final state or None).
    """
    B, T, H, K = q.shape
    V = v.shape[-1]
    h0 = (
        jnp.zeros((B, H, K, V), jnp.float32)
        if initial_state is None
        else initial_state.astype(jnp.float32)
    )
    g = per_key(g, K, token_axis=True)

    def body(h, xs):
        o_t, h = decay_attention_step(*xs, h, scale=scale)
        return h, o_t

    xs = tuple(jnp.moveaxis(a, 1, 0) for a in (q, k, v, g))
    h_final, o = jax.lax.scan(body, h0, xs)
    return jnp.moveaxis(o, 0, 1), (h_final if output_final_state else None)
