"""Gated Linear Attention's heads (Yang et al., 2024), ``model.la_kind = "gla"``: a decaying
state with a data-dependent decay per key from a rank-16 gate (n heads, x the normalised input):

  q, k, v = x W_q, x W_k, x W_v;  g = logsigmoid(x W_1 W_2 + b) / 16   [B, T, n, K]
  h_t = diag(exp(g_t)) h_{t-1} + k_t v_t^T;  o_t = h_t^T q_t / sqrt(K);  out = RMSNorm(o) * SiLU(x W_g)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from hwh_jax.layers.heads import HeadKind, register
from hwh_jax.layers.heads.decay import DecayHeads, build, decay_flops
from hwh_jax.layers.linear import dense
from hwh_jax.layers.variables import data

RANK, NORMALIZER = 16, 16.0


class GLAHeads(DecayHeads):
    """GLA heads: a decay per key from a rank-16 gate (module docstring)."""

    def make_extra(self, d_model, kw):
        n, K = self.num_heads, self.key_dim
        self.gk_down = data(dense(d_model, RANK, ("embed", None), **kw))
        self.gk_up = data(dense(RANK, n * K, (None, "heads"), use_bias=True, **kw))

    def extra_projections(self):
        return (self.gk_down,)

    def extra_heads(self, proj):
        return None  # the rank-16 bottleneck is not split by head

    def gates(self, q, k, v, extra, positions, conv):
        del positions, conv
        B, T, n, K = q.shape
        low = self.gk_up(extra).reshape(B, T, n, K).astype(jnp.float32)
        return q, k, v, jax.nn.log_sigmoid(low) / NORMALIZER


register(
    HeadKind(
        "gla",
        build(GLAHeads),
        decay_flops,
        about="decaying state, data-dependent decay per key (rank-16 gate)",
        conv_optional=True,
    )
)
