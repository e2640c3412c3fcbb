"""SwiGLU feed-forward (Shazeer, 2020): down(SiLU(gate(x)) * up(x))."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from hwh_jax.layers.linear import apply, dense, matmul
from kernels_pallas.sharding import constrain
from kernels_pallas.skinny_matmul import SkinnyMatmulSettings


class SwiGLU(nnx.Module):
    """x [B, T, d] -> down(SiLU(x W_gate) * (x W_up)) [B, T, d], hidden width ``hidden``
    (sharded over the tensor axis as "mlp"); ``matmul_settings``: how a decode step's
    products run (``extend``, through ``linear.matmul``)."""

    def __init__(
        self,
        d_model: int,
        hidden: int,
        *,
        out_std: float,
        dtype,
        param_dtype,
        matmul_settings: SkinnyMatmulSettings | None = None,
        rngs: nnx.Rngs,
    ):
        kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.gate = dense(d_model, hidden, ("embed", "mlp"), **kw)
        self.up = dense(d_model, hidden, ("embed", "mlp"), **kw)
        self.down = dense(hidden, d_model, ("mlp", "embed"), std=out_std, **kw)
        self.matmul_settings = matmul_settings

    def __call__(self, x):  # [B, T, d] -> [B, T, d]
        h = constrain(jax.nn.silu(self.gate(x)) * self.up(x), self.gate.kernel.shape[1])
        return self.down(h)

    def input_weight(self):
        """gate's and up's weights concatenated, [d, 2 hidden] in the compute dtype: what
        ``extend`` multiplies by (``Generator``'s decode loop forms it once)."""
        return jnp.concatenate(
            [
                self.gate.kernel[...].astype(self.gate.dtype),
                self.up.kernel[...].astype(self.up.dtype),
            ],
            axis=1,
        )

    def extend(self, x, weight=None):
        """``__call__`` as a decode step runs it: gate and up as one product (one kernel
        launch where there were two) by ``weight`` (default: ``input_weight()``)."""
        w = self.input_weight() if weight is None else weight
        g, u = jnp.split(matmul(x.astype(w.dtype), w, self.matmul_settings), 2, axis=-1)
        h = constrain(jax.nn.silu(g) * u, self.gate.kernel.shape[1])
        return apply(self.down, h, self.matmul_settings)
