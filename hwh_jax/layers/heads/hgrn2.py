"""HGRN-2's heads (Qin et al., 2024), ``model.la_kind = "hgrn2"``: a decaying state whose key
is one minus the forget gate (n heads, x the normalised input):

  q = SiLU(x W_q);  f = lb + (1 - lb) sigmoid(x W_f) per key;  k = 1 - f;  g = log f;  v = x W_i
  h_t = diag(f_t) h_{t-1} + k_t v_t^T;  o_t = h_t^T q_t / sqrt(K);  out = RMSNorm over all heads

No output gate. lb, the forget gate's lower bound, rises with depth: layer / num_layers (fixed;
HGRN learns it). With ``la_short_conv`` q and v are convolved; the forget gate stays the
token's own.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from hwh_jax.layers.heads import HeadKind, register
from hwh_jax.layers.heads.decay import DecayHeads, build, decay_flops
from hwh_jax.layers.norms import RMSNorm


class HGRN2Heads(DecayHeads):
    """HGRN-2 heads: k = 1 - f, no output gate, one norm over all heads (module docstring)."""

    gated = False
    conv_on_k = False

    @property
    def lower_bound(self) -> float:
        return self.layer / self.num_layers

    def make_norm(self, norm_eps, param_dtype):
        return RMSNorm(
            self.num_heads * self.value_dim,
            eps=norm_eps,
            dtype=jnp.float32,
            param_dtype=param_dtype,
            axis_name="heads",
        )

    def gates(self, q, k, v, extra, positions, conv):
        del extra, positions
        f = jax.nn.sigmoid(k.astype(jnp.float32))
        f = self.lower_bound + (1.0 - self.lower_bound) * f
        q = q if conv else jax.nn.silu(q)
        return q, (1.0 - f).astype(k.dtype), v, jnp.log(f)

    def out(self, o, gate, skip):
        B, T = o.shape[:2]
        return self.o_norm(o.reshape(B, T, self.num_heads * self.value_dim)).astype(self.dtype)


register(
    HeadKind(
        "hgrn2",
        build(HGRN2Heads),
        decay_flops,
        about="decaying state, forget gate per key, k = 1 - f",
        conv_optional=True,
    )
)
