"""RMSNorm and the gated RMSNorm of GDN heads.

``rms_norm`` and ``gated_rms_norm`` have hand-written backwards: they save the inputs (bf16 in
training, alive anyway) and the fp32 reciprocal rms r [..., 1], and compute, with e = dy (times
SiLU(gate) for the gated norm),

    x^ = x r,   g = e w,   dx = r (g - x^ mean(g x^)),   dw = sum over rows of e x^
    d gate = dy x^ w SiLU'(gate)

where autodiff of the forward formulas stores fp32 copies of x, x r and the gated product.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

f32 = jnp.float32


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def rms_norm(x, weight, eps: float, dtype):
    """x / rms(x) * weight over the last axis, statistics and product in fp32, cast to dtype."""
    return _rms_norm_fwd(x, weight, eps, dtype)[0]


def _rms_norm_fwd(x, weight, eps, dtype):
    x32 = x.astype(f32)
    r = jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (x32 * r * weight.astype(f32)).astype(dtype), (x, weight, r)


def _norm_grads(x, weight, r, e):
    """(dx, dw) of x r w given e, the fp32 cotangent of x r w."""
    xhat = x.astype(f32) * r
    g = e * weight.astype(f32)
    dx = r * (g - xhat * jnp.mean(g * xhat, axis=-1, keepdims=True))
    dw = jnp.sum((e * xhat).reshape(-1, x.shape[-1]), axis=0)
    return dx.astype(x.dtype), dw.astype(weight.dtype)


def _rms_norm_bwd(eps, dtype, res, dy):
    x, weight, r = res
    return _norm_grads(x, weight, r, dy.astype(f32))


rms_norm.defvjp(_rms_norm_fwd, _rms_norm_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def gated_rms_norm(x, gate, weight, eps: float, dtype):
    """rms_norm(x, weight) * SiLU(gate), in fp32, cast to dtype."""
    return _gated_fwd(x, gate, weight, eps, dtype)[0]


def _gated_fwd(x, gate, weight, eps, dtype):
    y, (_, _, r) = _rms_norm_fwd(x, weight, eps, f32)
    return (y * jax.nn.silu(gate.astype(f32))).astype(dtype), (x, gate, weight, r)


def _gated_bwd(eps, dtype, res, dy):
    x, gate, weight, r = res
    z = gate.astype(f32)
    sig = jax.nn.sigmoid(z)
    dy32 = dy.astype(f32)
    dx, dw = _norm_grads(x, weight, r, dy32 * z * sig)
    dgate = dy32 * x.astype(f32) * r * weight.astype(f32) * sig * (1.0 + z * (1.0 - sig))
    return dx, dgate.astype(gate.dtype), dw


gated_rms_norm.defvjp(_gated_fwd, _gated_bwd)


class RMSNorm(nnx.Module):
    """y = x / rms(x) * weight, over the last axis; statistics in fp32 (Zhang & Sennrich 2019)."""

    def __init__(self, dim: int, *, eps: float = 1e-6, dtype=jnp.float32,
                 param_dtype=jnp.float32, axis_name: str = "norm"):
        ones = nnx.with_partitioning(nnx.initializers.ones_init(), (axis_name,))
        self.weight = nnx.Param(ones(jax.random.key(0), (dim,), param_dtype))
        self.eps = eps
        self.dtype = dtype

    def __call__(self, x):
        return rms_norm(x, self.weight[...], self.eps, jnp.dtype(self.dtype))


class GatedRMSNorm(nnx.Module):
    """GDN output norm: RMSNorm(o) * SiLU(gate), per head over V, weight shared across heads."""

    def __init__(self, dim: int, *, eps: float = 1e-6, dtype=jnp.float32,
                 param_dtype=jnp.float32):
        self.norm = RMSNorm(dim, eps=eps, dtype=jnp.float32, param_dtype=param_dtype)
        self.dtype = dtype

    def __call__(self, o, gate):
        return gated_rms_norm(o, gate, self.norm.weight[...], self.norm.eps,
                              jnp.dtype(self.dtype))
