"""Gated DeltaNet, token by token: the specification every faster form is checked against.

Gated delta rule (Yang, Kautz, Hatamizadeh, "Gated Delta Networks", ICLR 2025), with the state
stored as ``h = S^T`` in ``[K, V]`` as fla does. For each token t of one head:

    h      <- h * exp(g_t)                       # decay, alpha_t = exp(g_t) in (0, 1]
    v'_t    = beta_t * (v_t - h^T k_t)           # delta rule: correct what h predicts for k_t
    h      <- h + k_t v'_t^T                     # write the correction
    o_t     = h^T (scale * q_t)                  # read

which is S_t = S_{t-1} alpha_t (I - beta_t k_t k_t^T) + beta_t v_t k_t^T, o_t = S_t q_t.
All arithmetic is fp32; outputs are cast back to v's dtype.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

_HI = jax.lax.Precision.HIGHEST


def gated_delta_rule_step(q_t, k_t, v_t, g_t, beta_t, state, *, scale=None):
    """One decode step.

    Args:
      q_t, k_t: [B, H, K]; v_t: [B, H, V]; g_t, beta_t: [B, H]; state: [B, H, K, V] (fp32).
      scale: query scale, default K**-0.5.
    Returns:
      (o_t [B, H, V] in v_t's dtype, new state [B, H, K, V] fp32).
    """
    K = q_t.shape[-1]
    scale = K**-0.5 if scale is None else scale
    f32 = jnp.float32
    q, k, v = q_t.astype(f32) * scale, k_t.astype(f32), v_t.astype(f32)
    h = state.astype(f32) * jnp.exp(g_t.astype(f32))[..., None, None]
    pred = jnp.einsum("bhkv,bhk->bhv", h, k, precision=_HI)
    v_new = beta_t.astype(f32)[..., None] * (v - pred)
    h = h + k[..., :, None] * v_new[..., None, :]
    o = jnp.einsum("bhkv,bhk->bhv", h, q, precision=_HI)
    return o.astype(v_t.dtype), h


def gated_delta_rule_recurrent(
    q, k, v, g, beta, *, scale=None, initial_state=None, output_final_state=False
):
    """``lax.scan`` over tokens of :func:`gated_delta_rule_step`.

    Shapes as fla: q, k [B, T, H, K]; v [B, T, H, V]; g, beta [B, T, H]; state [B, H, K, V].
    Returns (o [B, T, H, V], final_state or None).
    """
    B, T, H, K = q.shape
    V = v.shape[-1]
    h0 = (
        jnp.zeros((B, H, K, V), jnp.float32)
        if initial_state is None
        else initial_state.astype(jnp.float32)
    )

    def body(h, xs):
        o_t, h = gated_delta_rule_step(*xs, h, scale=scale)
        return h, o_t

    xs = tuple(jnp.moveaxis(a, 1, 0) for a in (q, k, v, g, beta))
    h_final, o = jax.lax.scan(body, h0, xs)
    return jnp.moveaxis(o, 0, 1), (h_final if output_final_state else None)
