"""RMSNorm and the residual add fused with it as Pallas (Triton) kernels, forward and backward.

Same contract and formulas as ``reference.py``. Written with jnp, XLA runs each direction as
several passes (a row reduction, then the elementwise product; the backward's row reduction,
dx and the column sum of dw each read x and dy again, and each re-reads the summands of dy when
it is a sum of several projections' gradients). Here:

  forward   one kernel: reads x (and d), writes h = x + d, y and r [N, 1] fp32
  backward  one kernel: reads h, r, dy (and dh), writes dh + dx and per-program partial sums
            of dw (summed in XLA: [programs, D] fp32)

Rows are independent; a program takes ``block_rows`` rows forward and ``block_rows * steps``
rows backward (a loop, accumulating its dw). The row length D must be a power of two (Triton
blocks); the dispatcher sends other widths to the reference. GPU only (Triton) and the generic
interpreter.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from kernels_pallas.dispatch import pow2
from kernels_pallas.rms_norm.settings import RMSNormSettings

f32 = jnp.float32


@dataclasses.dataclass(frozen=True)
class NormConfig:
    """How the norm kernels are launched for one shape (``plan``)."""

    eps: float
    block_rows: int  # rows per program (forward) and per loop step (backward)
    steps: int  # loop steps per backward program
    num_warps: int
    interpret: object = False


def plan(
    n_rows: int, dim: int, *, target: int = 8192, programs: int = 1024, interpret=False
) -> tuple[int, int, int]:
    """(block_rows, steps, num_warps): about ``target`` elements a block, rows a power of two
    dividing n_rows; backward programs of up to 8 blocks while at least ``programs`` remain."""
    br = 1
    while br * 2 * dim <= target and n_rows % (br * 2) == 0:
        br *= 2
    steps = 1
    while (
        steps < 8 and (n_rows // br) % (steps * 2) == 0 and n_rows // (br * steps * 2) >= programs
    ):
        steps *= 2
    return br, steps, (8 if br * dim >= 8192 else 4)


def _fwd_kernel(*refs, cfg, add):
    if add:
        x_ref, d_ref, w_ref, h_ref, y_ref, r_ref = refs
    else:
        x_ref, w_ref, y_ref, r_ref = refs
    x = x_ref[...]
    if add:  # the norm reads h rounded to the stream's dtype, as stored
        h = (x.astype(f32) + d_ref[...].astype(f32)).astype(h_ref.dtype)
        h_ref[...] = h
        x = h
    x = x.astype(f32)
    r = jax.lax.rsqrt(jnp.mean(x * x, axis=1, keepdims=True) + cfg.eps)
    y_ref[...] = (x * r * w_ref[...].astype(f32)).astype(y_ref.dtype)
    r_ref[...] = r


def _bwd_kernel(*refs, cfg, add):
    if add:
        h_ref, r_ref, w_ref, dy_ref, dh_ref, dx_ref, dw_ref = refs
    else:
        h_ref, r_ref, w_ref, dy_ref, dx_ref, dw_ref = refs
    BR = cfg.block_rows
    w = w_ref[...].astype(f32)

    def step(i, acc):
        rows = pl.ds(pl.multiple_of(i * BR, BR), BR)
        r = r_ref[rows, :]
        xhat = h_ref[rows, :].astype(f32) * r
        dy = dy_ref[rows, :].astype(f32)
        g = dy * w
        dx = r * (g - xhat * jnp.mean(g * xhat, axis=1, keepdims=True))
        if add:
            dx = dx + dh_ref[rows, :].astype(f32)
        dx_ref[rows, :] = dx.astype(dx_ref.dtype)
        return acc + jnp.sum(dy * xhat, axis=0, keepdims=True)

    dw_ref[...] = jax.lax.fori_loop(0, cfg.steps, step, jnp.zeros(w_ref.shape, f32))


def _params(cfg):
    if cfg.interpret is not False:
        return {}
    from jax.experimental.pallas import triton as plgpu

    return {"compiler_params": plgpu.CompilerParams(num_warps=cfg.num_warps, num_stages=1)}


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _forward(cfg, add, dtype, x, w, d=None):
    N, D = x.shape
    BR = cfg.block_rows
    rows = pl.BlockSpec((BR, D), lambda i: (i, 0))
    col = pl.BlockSpec((BR, 1), lambda i: (i, 0))
    wspec = pl.BlockSpec((1, D), lambda i: (0, 0))
    ins, in_specs = ([x, d, w], [rows, rows, wspec]) if add else ([x, w], [rows, wspec])
    outs = [jax.ShapeDtypeStruct((N, D), x.dtype)] if add else []
    outs += [jax.ShapeDtypeStruct((N, D), dtype), jax.ShapeDtypeStruct((N, 1), f32)]
    out_specs = [rows] * (len(outs) - 1) + [col]
    return pl.pallas_call(
        functools.partial(_fwd_kernel, cfg=cfg, add=add),
        grid=(N // BR,),
        in_specs=in_specs,
        out_specs=out_specs,
        out_shape=outs,
        interpret=cfg.interpret,
        name="rms_norm_fwd",
        **_params(cfg),
    )(*ins)


@functools.partial(jax.jit, static_argnums=(0, 1))
def _backward(cfg, add, h, r, w, dy, dh=None):
    N, D = h.shape
    R = cfg.block_rows * cfg.steps
    P = N // R
    rows = pl.BlockSpec((R, D), lambda i: (i, 0))
    col = pl.BlockSpec((R, 1), lambda i: (i, 0))
    wspec = pl.BlockSpec((1, D), lambda i: (0, 0))
    ins, in_specs = [h, r, w, dy], [rows, col, wspec, rows]
    if add:
        ins.append(dh)
        in_specs.append(rows)
    dx, dw = pl.pallas_call(
        functools.partial(_bwd_kernel, cfg=cfg, add=add),
        grid=(P,),
        in_specs=in_specs,
        out_specs=[rows, pl.BlockSpec((1, D), lambda i: (i, 0))],
        out_shape=[jax.ShapeDtypeStruct((N, D), h.dtype), jax.ShapeDtypeStruct((P, D), f32)],
        interpret=cfg.interpret,
        name="rms_norm_bwd",
        **_params(cfg),
    )(*ins)
    return dx, jnp.sum(dw, axis=0)


@functools.lru_cache(maxsize=None)
def _ops(cfg, dtype):
    """(norm(x, w) -> y, add_norm(x, d, w) -> (h, y)) on [N, D] rows, custom_vjp each."""

    @jax.custom_vjp
    def norm(x, w):
        return _forward(cfg, False, dtype, x, w)[0]

    def norm_fwd(x, w):
        y, r = _forward(cfg, False, dtype, x, w)
        return y, (x, r, w)

    def norm_bwd(res, dy):
        x, r, w = res
        dx, dw = _backward(cfg, False, x, r, w, dy)
        return dx, dw.reshape(w.shape).astype(w.dtype)

    norm.defvjp(norm_fwd, norm_bwd)

    @jax.custom_vjp
    def add_norm(x, d, w):
        h, y, _ = _forward(cfg, True, dtype, x, w, d)
        return h, y

    def add_norm_fwd(x, d, w):
        h, y, r = _forward(cfg, True, dtype, x, w, d)
        return (h, y), (h, r, w)

    def add_norm_bwd(res, cts):
        h, r, w = res
        dh, dy = cts
        dx, dw = _backward(cfg, True, h, r, w, dy, dh.astype(h.dtype))
        return dx, dx, dw.reshape(w.shape).astype(w.dtype)

    add_norm.defvjp(add_norm_fwd, add_norm_bwd)
    return norm, add_norm


def rms_norm_pallas(
    x,
    weight,
    delta=None,
    *,
    eps: float = 1e-6,
    dtype=None,
    settings: RMSNormSettings = RMSNormSettings(),
):
    """``kernels_pallas.rms_norm`` as the kernels above: y, or (h, y) given ``delta``.
    x (and delta, in x's dtype) [..., D] with D a power of two; weight [D]."""
    interpret = settings.interpret
    if interpret is False and settings.target() != "gpu":
        raise ValueError(
            f"rms_norm(impl='pallas') has a Triton (GPU) lowering only; on "
            f"platform {settings.target()!r} use impl='reference' or "
            f"interpret=True"
        )
    if interpret is not False and interpret is not True:
        raise ValueError(
            f"rms_norm(impl='pallas'): interpret must be False or True (the "
            f"generic interpreter; there is no TPU layout), got {interpret!r}"
        )
    D = x.shape[-1]
    if not pow2(D):
        raise ValueError(f"rms_norm(impl='pallas') needs a power-of-two width, got {D}")
    N = x.size // D
    br, steps, warps = plan(N, D)
    cfg = NormConfig(
        eps=float(eps), block_rows=br, steps=steps, num_warps=warps, interpret=interpret
    )
    norm, add_norm = _ops(cfg, jnp.dtype(x.dtype if dtype is None else dtype))
    w = weight.reshape(1, D)
    if delta is None:
        return norm(x.reshape(N, D), w).reshape(x.shape)
    h, y = add_norm(x.reshape(N, D), delta.reshape(N, D), w)
    return h.reshape(x.shape), y.reshape(x.shape)
