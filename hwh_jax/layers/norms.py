"""RMSNorm and the gated RMSNorm of GDN heads."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx


def rms_normalize(x, eps):
    x32 = x.astype(jnp.float32)
    return x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)


class RMSNorm(nnx.Module):
    """y = x / rms(x) * weight, over the last axis; statistics in fp32 (Zhang & Sennrich 2019)."""

    def __init__(self, dim: int, *, eps: float = 1e-6, dtype=jnp.float32,
                 param_dtype=jnp.float32, axis_name: str = "norm"):
        ones = nnx.with_partitioning(nnx.initializers.ones_init(), (axis_name,))
        self.weight = nnx.Param(ones(jax.random.key(0), (dim,), param_dtype))
        self.eps = eps
        self.dtype = dtype

    def __call__(self, x):
        return (rms_normalize(x, self.eps) * self.weight[...].astype(jnp.float32)).astype(self.dtype)


class GatedRMSNorm(nnx.Module):
    """GDN output norm: RMSNorm(o) * SiLU(gate), per head over V, weight shared across heads."""

    def __init__(self, dim: int, *, eps: float = 1e-6, dtype=jnp.float32,
                 param_dtype=jnp.float32):
        self.norm = RMSNorm(dim, eps=eps, dtype=jnp.float32, param_dtype=param_dtype)
        self.dtype = dtype

    def __call__(self, o, gate):
        return (self.norm(o) * jax.nn.silu(gate.astype(jnp.float32))).astype(self.dtype)
