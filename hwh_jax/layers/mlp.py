"""SwiGLU feed-forward (Shazeer, 2020): down(SiLU(gate(x)) * up(x))."""
from __future__ import annotations

import jax
from flax import nnx

from hwh_jax.layers.linear import apply, dense
from kernels_pallas.sharding import constrain


class SwiGLU(nnx.Module):
    """x [B, T, d] -> down(SiLU(x W_gate) * (x W_up)) [B, T, d], hidden width ``hidden``
    (sharded over the tensor axis as "mlp")."""

    def __init__(self, d_model: int, hidden: int, *, out_std: float, dtype, param_dtype,
                 rngs: nnx.Rngs):
        kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.gate = dense(d_model, hidden, ("embed", "mlp"), **kw)
        self.up = dense(d_model, hidden, ("embed", "mlp"), **kw)
        self.down = dense(hidden, d_model, ("mlp", "embed"), std=out_std, **kw)

    def __call__(self, x):  # [B, T, d] -> [B, T, d]
        h = constrain(jax.nn.silu(apply(self.gate, x)) * apply(self.up, x),
                      self.gate.kernel.shape[1])
        return apply(self.down, h)
