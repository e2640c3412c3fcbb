"""SwiGLU feed-forward (Shazeer, 2020): down(SiLU(gate(x)) * up(x))."""
from __future__ import annotations

import jax
from flax import nnx

from hwh_jax.layers.linear import dense
from kernels_pallas.sharding import constrain


class SwiGLU(nnx.Module):
    def __init__(self, d_model: int, hidden: int, *, out_std: float, dtype, param_dtype,
                 rngs: nnx.Rngs):
        self.gate = dense(d_model, hidden, ("embed", "mlp"), dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.up = dense(d_model, hidden, ("embed", "mlp"), dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.down = dense(hidden, d_model, ("mlp", "embed"), std=out_std, dtype=dtype,
                          param_dtype=param_dtype, rngs=rngs)

    def __call__(self, x):  # [B, T, d] -> [B, T, d]
        h = constrain(jax.nn.silu(self.gate(x)) * self.up(x), self.gate.kernel.shape[1])
        return self.down(h)
