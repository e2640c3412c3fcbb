"""RMSNorm (``kernels_pallas.rms_norm``: fused with the residual add before it by ``add``) and
the gated RMSNorm of GDN heads.

``gated_rms_norm`` has a hand-written backward (jnp): it saves o and the gate (bf16 in
training) and the fp32 reciprocal rms r [..., 1], and with e = dy SiLU(gate), x^ = o r:

    do = r (e w - x^ mean(e w x^)),   dw = sum over rows of e x^,   d gate = dy x^ w SiLU'(gate)

where autodiff of the forward formula stores fp32 copies of o, o r and the gated product.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from hwh_jax.layers.variables import partitioned
from kernels_pallas.rms_norm import RMSNormSettings, norm_grads, rms_norm, rms_stats

f32 = jnp.float32


class RMSNorm(nnx.Module):
    """y = x / rms(x) * weight, over the last axis; statistics in fp32 (Zhang & Sennrich 2019)."""

    def __init__(
        self,
        dim: int,
        *,
        eps: float = 1e-6,
        dtype=jnp.float32,
        param_dtype=jnp.float32,
        axis_name: str = "norm",
        settings: RMSNormSettings | None = None,
    ):
        ones = partitioned(nnx.initializers.ones_init(), (axis_name,))
        self.weight = nnx.Param(ones(jax.random.key(0), (dim,), param_dtype))
        self.eps = eps
        self.dtype = dtype
        self.settings = RMSNormSettings() if settings is None else settings

    def __call__(self, x):
        return rms_norm(x, self.weight[...], eps=self.eps, dtype=self.dtype, settings=self.settings)

    def add(self, x, delta):
        """(h, self(h)) with h = x + delta (x's dtype), in one pass; delta None: (x, self(x))."""
        if delta is None:
            return x, self(x)
        return rms_norm(
            x, self.weight[...], delta, eps=self.eps, dtype=self.dtype, settings=self.settings
        )


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def gated_rms_norm(x, gate, weight, eps: float, dtype):
    """x / rms(x) * weight * SiLU(gate) over the last axis, in fp32, cast to dtype."""
    return _gated_fwd(x, gate, weight, eps, dtype)[0]


def _gated_fwd(x, gate, weight, eps, dtype):
    x32, r = rms_stats(x, eps)
    y = x32 * r * weight.astype(f32) * jax.nn.silu(gate.astype(f32))
    return y.astype(dtype), (x, gate, weight, r)


def _gated_bwd(eps, dtype, res, dy):
    x, gate, weight, r = res
    z = gate.astype(f32)
    sig = jax.nn.sigmoid(z)
    dy32 = dy.astype(f32)
    dx, dw = norm_grads(x, weight, r, dy32 * z * sig)
    dgate = dy32 * x.astype(f32) * r * weight.astype(f32) * sig * (1.0 + z * (1.0 - sig))
    return dx.astype(x.dtype), dgate.astype(gate.dtype), dw


gated_rms_norm.defvjp(_gated_fwd, _gated_bwd)


class GatedRMSNorm(nnx.Module):
    """GDN output norm: RMSNorm(o) * SiLU(gate), per head over V, weight shared across heads."""

    def __init__(self, dim: int, *, eps: float = 1e-6, dtype=jnp.float32, param_dtype=jnp.float32):
        self.norm = RMSNorm(dim, eps=eps, dtype=jnp.float32, param_dtype=param_dtype)
        self.dtype = dtype

    def __call__(self, o, gate):
        return gated_rms_norm(o, gate, self.norm.weight[...], self.norm.eps, jnp.dtype(self.dtype))
