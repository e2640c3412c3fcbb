"""RMSNorm, and the residual add fused with it, in jnp with hand-written backwards.

    y = x r w,   r = 1 / sqrt(mean(x^2) + eps)          (statistics and product in fp32)
    add_rms_norm(x, d, w) = (h, rms_norm(h, w)),   h = x + d in x's dtype

Backward, with e the fp32 cotangent of x r w and x^ = x r:
    dx = r (e w - x^ mean(e w x^)),   dw = sum over rows of e x^
and for the fused add, dh_total = dh + dx (the cotangent of h from the residual stream plus the
norm's), which is also the cotangent of x and of d. Saved: the (bf16) input or h, and the fp32 r
[..., 1]; autodiff of the forward formula stores fp32 copies of x and x r instead. This is the
specification and the path off the GPU; ``pallas.py`` does each direction in one kernel.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

f32 = jnp.float32


def rms_stats(x, eps):
    """(x in fp32, r = 1 / sqrt(mean(x^2) + eps) [..., 1])."""
    x32 = x.astype(f32)
    return x32, jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)


def norm_grads(x, weight, r, e):
    """(dx fp32, dw in weight's dtype) of x r w, given e, the fp32 cotangent of x r w."""
    xhat = x.astype(f32) * r
    g = e * weight.astype(f32)
    dx = r * (g - xhat * jnp.mean(g * xhat, axis=-1, keepdims=True))
    dw = jnp.sum((e * xhat).reshape(-1, x.shape[-1]), axis=0)
    return dx, dw.astype(weight.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def rms_norm_reference(x, weight, eps: float, dtype):
    """x / rms(x) * weight over the last axis, in fp32, cast to ``dtype``."""
    return _fwd(x, weight, eps, dtype)[0]


def _fwd(x, weight, eps, dtype):
    x32, r = rms_stats(x, eps)
    return (x32 * r * weight.astype(f32)).astype(dtype), (x, weight, r)


def _bwd(eps, dtype, res, dy):
    x, weight, r = res
    dx, dw = norm_grads(x, weight, r, dy.astype(f32))
    return dx.astype(x.dtype), dw


rms_norm_reference.defvjp(_fwd, _bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def add_rms_norm_reference(x, delta, weight, eps: float, dtype):
    """(h, rms_norm(h, weight)) with h = x + delta; delta in x's dtype."""
    return _add_fwd(x, delta, weight, eps, dtype)[0]


def _add_fwd(x, delta, weight, eps, dtype):
    h = x + delta
    y, (_, _, r) = _fwd(h, weight, eps, dtype)
    return (h, y), (h, weight, r)


def _add_bwd(eps, dtype, res, cts):
    h, weight, r = res
    dh, dy = cts
    dx, dw = norm_grads(h, weight, r, dy.astype(f32))
    d = (dx + dh.astype(f32)).astype(h.dtype)
    return d, d, dw


add_rms_norm_reference.defvjp(_add_fwd, _add_bwd)
