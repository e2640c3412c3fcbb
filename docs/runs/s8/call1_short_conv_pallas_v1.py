"""The GDN short convolution + SiLU + per-head L2 norm as Pallas (Triton) kernels, fwd and bwd.

Same contract as ``reference.short_conv_reference``. Written with jnp, the op is a string of
elementwise passes and their gradients (the profile of HwH-380m's 2K training step on an H200
charged ~21 ms of its 232 to ``causal_conv1d``, ``ShortConv`` and ``l2_normalize``); here it is one
kernel forward (reads x, writes y) and one backward (reads x and dy, writes dx and per-tile
partial sums of dw).

One program per (batch row, tile of ``block_t`` tokens, head). x is passed whole along time and
each program reads the rows it needs at their offsets (the tap of lag j reads rows t - j; the
backward reads dy at t + j), so no halo is copied. At the two ends of the sequence an offset
tile would leave [0, T): there the tile is read from the nearest in-range position and moved
into place by a 0/1 selection matmul (exact), under a ``cond`` so that only the first and last
tiles pay for it. The tap mask comes from the number of tokens since the document began
(``doc_offsets``, clipped to W - 1), which is also what makes rows before t = 0 drop out.

With lag j, tap weight w_{W-1-j}, the mask m_j(t) = [since(t) >= j], z = conv(x), s = SiLU(z),
n = s / |s| (per head):
    forward   z(t)  = sum_j w_{W-1-j} m_j(t) x(t - j)
    backward  ds    = (dy - n (dy . n)) / |s|          (ds = dy without the norm)
              dz    = ds SiLU'(z)
              dx(t) = sum_j w_{W-1-j} m_j(t + j) dz(t + j)
              dw_{W-1-j} = sum_t m_j(t) x(t - j) dz(t)
The backward recomputes z at rows t .. t + W - 1 from x rather than saving it. Arithmetic is
fp32 inside; matmul-free except at the sequence's ends. GPU only (Triton layout) and the generic
interpreter; TPU runs the jnp reference (``AUTO_IMPL``).
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

f32 = jnp.float32


@dataclasses.dataclass(frozen=True)
class ConvConfig:
    width: int            # W, the taps
    block_t: int          # tokens per program
    normalize: bool
    eps: float
    interpret: object = False
    num_warps: int = 4


def _select(tile, delta):
    """Rows r + delta of ``tile`` (zero where that leaves the tile), by a 0/1 matmul: exact
    (one nonzero product per entry, fp32 accumulation)."""
    BT = tile.shape[0]
    rows = jax.lax.broadcasted_iota(jnp.int32, (BT, BT), 0)
    cols = jax.lax.broadcasted_iota(jnp.int32, (BT, BT), 1)
    sel = jnp.where(cols == rows + delta, 1.0, 0.0).astype(tile.dtype)
    prec = jax.lax.Precision.HIGHEST if tile.dtype == f32 else None
    return jax.lax.dot_general(sel, tile, (((1,), (0,)), ((), ())), precision=prec,
                               preferred_element_type=f32).astype(tile.dtype)


def _rows(ref, t0, off, T, BT):
    """Rows [t0 + off, t0 + off + BT) of a whole-sequence ref [T, X], zero outside [0, T)."""
    start = jnp.clip(t0 + off, 0, T - BT)
    tile = ref[pl.ds(start, BT), :]
    if off == 0:
        return tile
    delta = t0 + off - start
    return jax.lax.cond(delta == 0, lambda x: x, lambda x: _select(x, delta), tile)


def _col(ref, t0, off, T, BT):
    """As ``_rows`` for a [T, 1] column (widened to 16 columns for the edge matmul)."""
    start = jnp.clip(t0 + off, 0, T - BT)
    col = ref[pl.ds(start, BT), :]
    if off == 0:
        return col
    delta = t0 + off - start

    def shift(c):
        wide = _select(jnp.broadcast_to(c, (BT, 16)), delta)
        return jnp.max(wide, axis=1, keepdims=True)

    return jax.lax.cond(delta == 0, lambda c: c, shift, col)


def _tap(w_ref, k):
    return w_ref[pl.ds(k, 1), :].astype(f32)                     # [1, X]


def _conv(x_ref, w_ref, m, t0, off, T, cfg):
    """z at rows t0 + off ..: sum_j w_{W-1-j} m_j x(t - j); m the clipped offsets there."""
    W, BT = cfg.width, cfg.block_t
    z = _tap(w_ref, W - 1) * _rows(x_ref, t0, off, T, BT).astype(f32)
    for j in range(1, W):
        x = _rows(x_ref, t0, off - j, T, BT).astype(f32)
        z += _tap(w_ref, W - 1 - j) * jnp.where(m >= j, x, 0.0)
    return z


def _fwd_kernel(x_ref, m_ref, w_ref, y_ref, *, T, cfg):
    t0 = pl.program_id(1) * cfg.block_t
    m = m_ref[pl.ds(t0, cfg.block_t), :]
    s = jax.nn.silu(_conv(x_ref, w_ref, m, t0, 0, T, cfg))
    if cfg.normalize:
        s = s * jax.lax.rsqrt(jnp.sum(s * s, axis=1, keepdims=True) + cfg.eps)
    y_ref[...] = s.astype(y_ref.dtype)


def _dz(z, dy, cfg):
    sig = jax.nn.sigmoid(z)
    s = z * sig
    if cfg.normalize:
        r = jax.lax.rsqrt(jnp.sum(s * s, axis=1, keepdims=True) + cfg.eps)
        n = s * r
        dy = r * (dy - n * jnp.sum(dy * n, axis=1, keepdims=True))
    return dy * sig * (1.0 + z * (1.0 - sig))


def _bwd_kernel(x_ref, m_ref, w_ref, dy_ref, dx_ref, dw_ref, *, T, cfg):
    W, BT = cfg.width, cfg.block_t
    t0 = pl.program_id(1) * BT
    Wp = dw_ref.shape[0]
    rows = jax.lax.broadcasted_iota(jnp.int32, (Wp, dw_ref.shape[1]), 0)
    dw = jnp.zeros(dw_ref.shape, f32)
    dx = jnp.zeros(dx_ref.shape, f32)
    for j in range(W):                      # dz at rows t + j, each feeding dx(t) by lag j
        m = _col(m_ref, t0, j, T, BT)
        dz = _dz(_conv(x_ref, w_ref, m, t0, j, T, cfg),
                 _rows(dy_ref, t0, j, T, BT).astype(f32), cfg)
        dx += _tap(w_ref, W - 1 - j) * jnp.where(m >= j, dz, 0.0)
        if j == 0:
            for i in range(W):              # dw_{W-1-i}: x(t - i) dz(t) over this tile
                x = _rows(x_ref, t0, -i, T, BT).astype(f32)
                part = jnp.sum(jnp.where(m >= i, x, 0.0) * dz, axis=0, keepdims=True)
                dw = jnp.where(rows == W - 1 - i, part, dw)
    dx_ref[...] = dx.astype(dx_ref.dtype)
    dw_ref[...] = dw


def _specs(B, T, heads, X, BT):
    sq = pl.squeezed
    whole = pl.BlockSpec((sq, T, X), lambda b, t, h: (b, 0, h))        # all of time
    whole_m = pl.BlockSpec((sq, T, 1), lambda b, t, h: (b, 0, 0))
    tile = pl.BlockSpec((sq, BT, X), lambda b, t, h: (b, t, h))
    return whole, whole_m, tile


def _params(cfg):
    if cfg.interpret is not False:
        return {}
    from jax.experimental.pallas import triton as plgpu
    return {"compiler_params": plgpu.CompilerParams(num_warps=cfg.num_warps, num_stages=1)}


def _forward(cfg, heads, x, w, m):
    B, T, C = x.shape
    X, BT = C // heads, cfg.block_t
    whole, whole_m, tile = _specs(B, T, heads, X, BT)
    wspec = pl.BlockSpec((w.shape[0], X), lambda b, t, h: (0, h))
    return pl.pallas_call(
        functools.partial(_fwd_kernel, T=T, cfg=cfg), grid=(B, T // BT, heads),
        in_specs=[whole, whole_m, wspec], out_specs=tile,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), interpret=cfg.interpret,
        name="short_conv_fwd", **_params(cfg))(x, m, w)


def _backward(cfg, heads, x, w, m, dy):
    B, T, C = x.shape
    X, BT = C // heads, cfg.block_t
    NT, Wp = T // BT, w.shape[0]
    whole, whole_m, tile = _specs(B, T, heads, X, BT)
    wspec = pl.BlockSpec((Wp, X), lambda b, t, h: (0, h))
    sq = pl.squeezed
    dx, dw = pl.pallas_call(
        functools.partial(_bwd_kernel, T=T, cfg=cfg), grid=(B, NT, heads),
        in_specs=[whole, whole_m, wspec, whole],
        out_specs=[tile, pl.BlockSpec((sq, sq, Wp, X), lambda b, t, h: (b, t, 0, h))],
        out_shape=[jax.ShapeDtypeStruct(x.shape, x.dtype),
                   jax.ShapeDtypeStruct((B, NT, Wp, C), f32)],
        interpret=cfg.interpret, name="short_conv_bwd", **_params(cfg))(x, m, w, dy)
    return dx, jnp.sum(dw, axis=(0, 1))


@functools.lru_cache(maxsize=None)
def _op(cfg, heads):
    """custom_vjp op (x [B,T,C], w [Wp,C] fp32, m [B,T,1] fp32) -> y; T a multiple of the tile."""

    @jax.custom_vjp
    def op(x, w, m):
        return _forward(cfg, heads, x, w, m)

    def fwd(x, w, m):
        return op(x, w, m), (x, w, m)

    def bwd(res, dy):
        x, w, m = res
        dx, dw = _backward(cfg, heads, x, w, m, dy.astype(x.dtype))
        return dx, dw, jnp.zeros_like(m)

    op.defvjp(fwd, bwd)
    return op


def _pow2(n):
    return n > 0 and n & (n - 1) == 0


def short_conv_pallas(x, weight, segment_ids=None, *, heads: int = 1, normalize: bool = False,
                      eps: float = 1e-6, block_t: int = 64, num_warps: int = 4,
                      interpret=False):
    """``short_conv`` as the kernels above. x [B, T, C]; weight [W, C] (any float dtype, the
    gradient comes back in it); segment_ids [B, T] or None. T is padded to the tile."""
    from kernels_pallas.short_conv.reference import doc_offsets
    B, T, C = x.shape
    W = weight.shape[0]
    if interpret is not False and interpret is not True:
        raise ValueError(f"short_conv(impl='pallas'): interpret must be False or True (the "
                         f"generic interpreter; there is no TPU layout), got {interpret!r}")
    if interpret is False and jax.default_backend() != "gpu":
        raise ValueError(f"short_conv(impl='pallas') has a Triton (GPU) lowering only; on "
                         f"backend {jax.default_backend()!r} use impl='reference' or "
                         f"interpret=True")
    X = C // heads
    if interpret is False:
        for name, n in (("channels per head", X), ("block_t", block_t)):
            if not _pow2(n) or n < 16:
                raise ValueError(f"short_conv(impl='pallas') on GPU needs {name} a power of "
                                 f"two >= 16, got {n}")
    bt = min(block_t, max(16, 1 << (T - 1).bit_length()))       # short sequences: one tile
    pad = (-T) % bt
    cfg = ConvConfig(width=W, block_t=bt, normalize=normalize, eps=eps, interpret=interpret,
                     num_warps=num_warps)
    m = jnp.minimum(doc_offsets(segment_ids, B, T), W - 1).astype(f32)[..., None]
    Wp = 1 << (W - 1).bit_length()
    w = jnp.pad(weight.astype(f32), ((0, Wp - W), (0, 0)))
    xp = jnp.pad(x, ((0, 0), (0, pad), (0, 0))) if pad else x
    mp = jnp.pad(m, ((0, 0), (0, pad), (0, 0))) if pad else m
    y = _op(cfg, heads)(xp, w, mp)
    return y[:, :T] if pad else y
