"""RetNet's multi-scale retention (Sun et al., 2023) as linear heads, ``model.la_kind =
"retnet"``: a decaying state with a fixed decay per head, q and k rotated (n heads, x the
normalised input):

  q, k = RoPE(x W_q), RoPE(x W_k);  v = x W_v;  g = log(1 - 2^(-5-h)) for head h
  h_t = exp(g) h_{t-1} + k_t v_t^T;  o_t = h_t^T q_t / sqrt(K);  out = RMSNorm(o) * SiLU(x W_g)

With ``la_short_conv`` the convolved q and k are rotated.
"""

from __future__ import annotations

import jax.numpy as jnp

from hwh_jax.layers.heads import HeadKind, register
from hwh_jax.layers.heads.decay import DecayHeads, build, decay_flops
from hwh_jax.layers.rope import apply_rope


class RetNetHeads(DecayHeads):
    """Retention heads: fixed per-head decay, rotated q and k (module docstring)."""

    def __init__(self, d_model, num_heads, key_dim, value_dim, **kw):
        if key_dim % 2:
            raise ValueError(f"retnet heads rotate q and k: la_key_dim must be even, got {key_dim}")
        super().__init__(d_model, num_heads, key_dim, value_dim, **kw)

    def gates(self, q, k, v, extra, positions, conv):
        del extra, conv
        q = apply_rope(q, positions, theta=self.rope_theta)
        k = apply_rope(k, positions, theta=self.rope_theta)
        h = jnp.arange(self.num_heads, dtype=jnp.float32)
        g = jnp.log1p(-(2.0 ** (-5.0 - h)))
        return q, k, v, jnp.broadcast_to(g, q.shape[:3])


register(
    HeadKind(
        "retnet",
        build(RetNetHeads),
        decay_flops,
        about="retention: decaying state, fixed decay per head, rotated q and k",
        conv_optional=True,
        torch_form=True,
    )
)
