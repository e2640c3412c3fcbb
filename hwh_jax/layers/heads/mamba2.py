"""Mamba-2's SSD heads (Dao and Gu, 2024), ``model.la_kind = "mamba2"``: a decaying state with
a data-dependent decay per head, B and C as key and query (n heads, x the normalised input):

  q = C, k = B, x' = SiLU(ShortConv(.)) of x W_C, x W_B, x W_x;  dt = softplus(x W_dt + dt_bias)
  g = -exp(A_log) dt per head;  v = x' dt;  h_t = exp(g_t) h_{t-1} + k_t v_t^T;  o_t = h_t^T q_t
  o += D x';  out = RMSNorm(o * SiLU(x W_z))                  (the gate before the norm)

Its short convolution is its own (``la_short_conv`` does not apply); scale 1.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from hwh_jax.layers.heads import HeadKind, register
from hwh_jax.layers.heads.decay import DecayHeads, build, decay_flops
from hwh_jax.layers.heads.parts import a_log_init, dt_bias_init
from hwh_jax.layers.linear import dense
from hwh_jax.layers.norms import RMSNorm
from hwh_jax.layers.variables import data, partitioned


class Mamba2Heads(DecayHeads):
    """Mamba-2 (SSD) heads: B, C, x convolved, a decay per head from dt, D skip (module docstring)."""

    builtin_conv = True

    def make_extra(self, d_model, kw):
        self.dt_proj = data(dense(d_model, self.num_heads, ("embed", "heads"), **kw))

    def extra_projections(self):
        return (self.dt_proj,)

    def make_params(self, param_dtype, rngs):
        n = (self.num_heads,)
        self.A_log = nnx.Param(partitioned(a_log_init, ("heads",))(rngs.params(), n, param_dtype))
        self.dt_bias = nnx.Param(
            partitioned(dt_bias_init, ("heads",))(rngs.params(), n, param_dtype)
        )
        ones = partitioned(nnx.initializers.ones_init(), ("heads",))
        self.D = nnx.Param(ones(rngs.params(), n, param_dtype))

    def make_norm(self, norm_eps, param_dtype):
        return RMSNorm(self.value_dim, eps=norm_eps, dtype=jnp.float32, param_dtype=param_dtype)

    @property
    def scale(self) -> float:
        return 1.0

    def _heads(self, q, k, v, extra, positions, convs=None):
        del q, k, v, positions  # the convolved ones are used
        B, T, _ = extra.shape
        n, K, V = self.num_heads, self.key_dim, self.value_dim
        f32 = jnp.float32
        q, k, v = convs
        dt = jax.nn.softplus(extra.astype(f32) + self.dt_bias[...].astype(f32))
        g = -jnp.exp(self.A_log[...].astype(f32)) * dt  # [B, T, n]
        q, k = q.reshape(B, T, n, K), k.reshape(B, T, n, K)
        x = v.reshape(B, T, n, V)
        return q, k, (x.astype(f32) * dt[..., None]).astype(x.dtype), g, x

    def out(self, o, gate, skip):
        B, T = o.shape[:2]
        n, V = self.num_heads, self.value_dim
        f32 = jnp.float32
        o = o.astype(f32) + self.D[...].astype(f32)[:, None] * skip.astype(f32)
        o = o * jax.nn.silu(gate.reshape(B, T, n, V).astype(f32))
        return self.o_norm(o).astype(self.dtype).reshape(B, T, n * V)


register(
    HeadKind(
        "mamba2",
        build(Mamba2Heads),
        decay_flops,
        about="SSD: decaying state, data-dependent decay per head, B and C as k and q",
        no_decay=("A_log", "dt_bias"),
    )
)
