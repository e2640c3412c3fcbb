"""Lightning Attention's linear heads (Qin et al., 2024), as ``model.la_kind = "lightning"``: a
decaying state with a fixed decay per head, ALiBi's slopes (n heads, x the normalised input):

  q, k = SiLU(x W_q), SiLU(x W_k);  v = x W_v;  g = -2^(-8 (h+1) / n) for head h
  h_t = exp(g) h_{t-1} + k_t v_t^T;  o_t = h_t^T q_t / sqrt(K);  out = RMSNorm(o) * SiLU(x W_g)

The smallest kind: the file to copy for a new one (docs/architecture.md). ``DecayHeads`` has the
projections, the chunked form, documents and decoding; a kind writes its gates and registers.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from hwh_jax.layers.heads import HeadKind, register
from hwh_jax.layers.heads.decay import DecayHeads, build, decay_flops


class LightningHeads(DecayHeads):
    """Lightning heads: fixed per-head decay, SiLU on q and k (module docstring)."""

    def gates(self, q, k, v, extra, positions, conv):
        del extra, positions
        if not conv:  # the convolution's SiLU takes the place of this one
            q, k = jax.nn.silu(q), jax.nn.silu(k)
        n = self.num_heads
        h = jnp.arange(n, dtype=jnp.float32)
        g = -(2.0 ** (-8.0 * (h + 1) / n))
        return q, k, v, jnp.broadcast_to(g, q.shape[:3])


register(
    HeadKind(
        "lightning",
        build(LightningHeads),
        decay_flops,
        about="decaying state, fixed decay per head (ALiBi slopes)",
        conv_optional=True,
        torch_form=True,
    )
)
