"""The GDN short convolution + SiLU + per-head L2 norm as Pallas (Triton) kernels, fwd and bwd.

Same contract as ``reference.short_conv_reference``. Written with jnp, the op is a string of
elementwise passes and their gradients; here the forward is one kernel (reads x, writes y) and
the backward two: one reads x and dy and writes dz and per-tile partial sums of dw, one reads dz
and writes dx (its transposed convolution).

One program per (batch row, tile of ``block_t`` tokens, head). x is passed whole along time and
each program reads the rows its taps need at their offsets (lag j reads rows t - j), so no halo
is copied. Only the first tile can reach before row 0: it reads its taps from a copy of its rows
behind W - 1 zero rows (``_head``, 2 block_t rows a sequence), in its own branch; the transposed
convolution reaches ahead instead (rows t + j), and its last tile reads from a copy of its rows
ahead of zero rows (``_tail``). Registers per thread decide how many programs an SM holds, so
the taps are loaded where they are used and not kept live across the norm's reductions
(``bench/triton_regs.py`` counts them without a GPU). The tap mask comes from the tokens since
the document began (``doc_offsets``, clipped to W - 1), which also drops the rows before t = 0.

With lag j, tap weight w_{W-1-j}, mask m_j(t) = [since(t) >= j], s = SiLU(z), n = s / |s|,
y = c n with the scale c (y = s without the norm):
    forward   z(t)  = sum_j w_{W-1-j} m_j(t) x(t - j)
    backward  ds    = (c dy - n (c dy . n)) / |s|      (ds = dy without the norm)
              dz    = ds SiLU'(z)                      (kernel; z recomputed from x)
              dw_{W-1-j} = sum_t m_j(t) x(t - j) dz(t)  (kernel, per tile; summed in XLA)
              dx(t) = sum_j w_{W-1-j} m_j(t + j) dz(t + j)   (second kernel)
Arithmetic is fp32 inside; dz is stored in x's dtype. GPU only (Triton) and the generic
interpreter; TPU runs the jnp reference (``ShortConvSettings.AUTO``).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from kernels_pallas.dispatch import pow2
from kernels_pallas.short_conv.reference import doc_offsets
from kernels_pallas.short_conv.settings import ShortConvSettings

f32 = jnp.float32


@dataclasses.dataclass(frozen=True)
class ConvConfig:
    """The convolution's static shape and launch settings, the key of its jitted kernels."""

    width: int  # W, the taps
    block_t: int  # tokens per program
    normalize: bool
    eps: float
    interpret: object = False
    scale: float = 1.0  # multiplies the normalised output
    num_warps: int = 4


def _head(x, W, BT):
    """The first tile's rows behind W - 1 zero rows, [B, 2 BT, C] (a power of two for Triton's
    block): the first tile reads its taps here, every other tile from x itself."""
    return jnp.pad(x[:, :BT], ((0, 0), (W - 1, BT - W + 1), (0, 0)))


def _tap(x_ref, head_ref, t0, j, BT, W, first):
    """x(t - j) at the tile's rows [t0, t0 + BT), fp32, zero before row 0; j may be traced."""
    rows = head_ref[pl.ds(W - 1 - j, BT), :] if first else x_ref[pl.ds(t0 - j, BT), :]
    return rows.astype(f32)


def _taps(x_ref, head_ref, t0, BT, W, first):
    """x(t - j) for j = 0 .. W-1 at the tile's rows, fp32."""
    return [_tap(x_ref, head_ref, t0, j, BT, W, first) for j in range(W)]


def _conv(xs, w_ref, m, W):
    """z = sum_j w_{W-1-j} m_j x(t - j); m the tokens since the document began (clipped)."""
    z = w_ref[pl.ds(W - 1, 1), :].astype(f32) * xs[0]
    for j in range(1, W):
        z += w_ref[pl.ds(W - 1 - j, 1), :].astype(f32) * jnp.where(m >= j, xs[j], 0.0)
    return z


def _per_tile(body):
    """Run ``body(first)`` with first = whether this program's tile is the sequence's first;
    each case in its own branch, so that only the first tile pays for the edge."""
    t = pl.program_id(1)
    pl.when(t == 0)(functools.partial(body, True))
    pl.when(t > 0)(functools.partial(body, False))


def _fwd_kernel(x_ref, head_ref, m_ref, w_ref, y_ref, *, cfg):
    W, BT = cfg.width, cfg.block_t
    t0 = pl.program_id(1) * BT

    def body(first):
        m = m_ref[...]
        s = jax.nn.silu(_conv(_taps(x_ref, head_ref, t0, BT, W, first), w_ref, m, W))
        if cfg.normalize:
            r = jax.lax.rsqrt(jnp.sum(s * s, axis=1, keepdims=True) + cfg.eps)
            s = s * (r * cfg.scale if cfg.scale != 1.0 else r)
        y_ref[...] = s.astype(y_ref.dtype)

    _per_tile(body)


def _bwd_kernel(x_ref, head_ref, m_ref, w_ref, dy_ref, dz_ref, dw_ref, *, cfg):
    """dz at the tile's rows and this tile's part of dw; dx is dz's transposed convolution.
    dw reads its taps again, one per step of a loop, rather than keeping those of z live."""
    W, BT = cfg.width, cfg.block_t
    t0 = pl.program_id(1) * BT

    def body(first):
        m = m_ref[...]
        z = _conv(_taps(x_ref, head_ref, t0, BT, W, first), w_ref, m, W)
        sig = jax.nn.sigmoid(z)
        dy = dy_ref[...].astype(f32)
        if cfg.normalize:
            if cfg.scale != 1.0:
                dy = dy * cfg.scale
            s = z * sig
            r = jax.lax.rsqrt(jnp.sum(s * s, axis=1, keepdims=True) + cfg.eps)
            n = s * r
            dy = r * (dy - n * jnp.sum(dy * n, axis=1, keepdims=True))
        dz = dy * sig * (1.0 + z * (1.0 - sig))
        dz_ref[...] = dz.astype(dz_ref.dtype)
        rows = jax.lax.broadcasted_iota(jnp.int32, dw_ref.shape, 0)

        def tap(j, dw):  # dw_{W-1-j}: sum over the tile of m_j x(t - j) dz
            xj = _tap(x_ref, head_ref, t0, j, BT, W, first)
            part = jnp.sum(jnp.where(m >= j, xj, 0.0) * dz, axis=0, keepdims=True)
            return jnp.where(rows == W - 1 - j, part, dw)

        dw_ref[...] = jax.lax.fori_loop(0, W, tap, jnp.zeros(dw_ref.shape, f32))

    _per_tile(body)


def _tail(a, BT):
    """The last tile's rows ahead of BT zero rows, [B, 2 BT, ...]: the last tile of the
    transposed convolution reads its taps here, every other tile from ``a`` itself."""
    return jnp.pad(a[:, a.shape[1] - BT :], ((0, 0), (0, BT)) + ((0, 0),) * (a.ndim - 2))


def _dx_kernel(dz_ref, dz_tail_ref, m_ref, m_tail_ref, w_ref, dx_ref, *, cfg, last_tile):
    """dx(t) = sum_j w_{W-1-j} m_j(t + j) dz(t + j) at the tile's rows, fp32 inside: the
    forward's taps mirrored, reaching j rows ahead (zero past the end)."""
    W, BT = cfg.width, cfg.block_t
    t0 = pl.program_id(1) * BT

    def body(last):
        dx = w_ref[pl.ds(W - 1, 1), :].astype(f32) * dz_ref[pl.ds(t0, BT), :].astype(f32)
        for j in range(1, W):
            if last:
                dz, m = dz_tail_ref[pl.ds(j, BT), :], m_tail_ref[pl.ds(j, BT), :]
            else:
                dz, m = dz_ref[pl.ds(t0 + j, BT), :], m_ref[pl.ds(t0 + j, BT), :]
            dx += w_ref[pl.ds(W - 1 - j, 1), :].astype(f32) * jnp.where(m >= j, dz.astype(f32), 0.0)
        dx_ref[...] = dx.astype(dx_ref.dtype)

    t = pl.program_id(1)
    pl.when(t == last_tile)(functools.partial(body, True))
    pl.when(t < last_tile)(functools.partial(body, False))


def _specs(B, T, heads, X, BT):
    sq = pl.squeezed
    whole = pl.BlockSpec((sq, T, X), lambda b, t, h: (b, 0, h))  # all of time
    head = pl.BlockSpec((sq, 2 * BT, X), lambda b, t, h: (b, 0, h))
    tile_m = pl.BlockSpec((sq, BT, 1), lambda b, t, h: (b, t, 0))
    tile = pl.BlockSpec((sq, BT, X), lambda b, t, h: (b, t, h))
    return whole, head, tile_m, tile


def _params(cfg):
    if cfg.interpret is not False:
        return {}
    from jax.experimental.pallas import triton as plgpu

    return {"compiler_params": plgpu.CompilerParams(num_warps=cfg.num_warps, num_stages=1)}


# Jitted with the config static: the layers of a model that share a shape trace and lower these
# kernels once (HwH-380m's step has 144 short-convolution calls of a handful of shapes; lowering
# each to Triton IR took most of the step's 31-s trace and lowering on this project's CPU).
@functools.partial(jax.jit, static_argnums=(0, 1))
def _forward(cfg, heads, x, w, m):
    B, T, C = x.shape
    X, BT = C // heads, cfg.block_t
    whole, head, tile_m, tile = _specs(B, T, heads, X, BT)
    wspec = pl.BlockSpec((w.shape[0], X), lambda b, t, h: (0, h))
    return pl.pallas_call(
        functools.partial(_fwd_kernel, cfg=cfg),
        grid=(B, T // BT, heads),
        in_specs=[whole, head, tile_m, wspec],
        out_specs=tile,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        interpret=cfg.interpret,
        name="short_conv_fwd",
        **_params(cfg),
    )(x, _head(x, cfg.width, BT), m, w)


@functools.partial(jax.jit, static_argnums=(0, 1))
def _backward(cfg, heads, x, w, m, dy):
    B, T, C = x.shape
    X, BT = C // heads, cfg.block_t
    NT, Wp = T // BT, w.shape[0]
    whole, head, tile_m, tile = _specs(B, T, heads, X, BT)
    wspec = pl.BlockSpec((Wp, X), lambda b, t, h: (0, h))
    sq = pl.squeezed
    dz, dw = pl.pallas_call(
        functools.partial(_bwd_kernel, cfg=cfg),
        grid=(B, NT, heads),
        in_specs=[whole, head, tile_m, wspec, tile],
        out_specs=[tile, pl.BlockSpec((sq, sq, Wp, X), lambda b, t, h: (b, t, 0, h))],
        out_shape=[
            jax.ShapeDtypeStruct(x.shape, x.dtype),
            jax.ShapeDtypeStruct((B, NT, Wp, C), f32),
        ],
        interpret=cfg.interpret,
        name="short_conv_bwd",
        **_params(cfg),
    )(x, _head(x, cfg.width, BT), m, w, dy)
    m_whole = pl.BlockSpec((sq, T, 1), lambda b, t, h: (b, 0, 0))
    m_tail = pl.BlockSpec((sq, 2 * BT, 1), lambda b, t, h: (b, 0, 0))
    tail = pl.BlockSpec((sq, 2 * BT, X), lambda b, t, h: (b, 0, h))
    dx = pl.pallas_call(
        functools.partial(_dx_kernel, cfg=cfg, last_tile=NT - 1),
        grid=(B, NT, heads),
        in_specs=[whole, tail, m_whole, m_tail, wspec],
        out_specs=tile,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        interpret=cfg.interpret,
        name="short_conv_dx",
        **_params(cfg),
    )(dz, _tail(dz, BT), m, _tail(m, BT), w)
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


def short_conv_pallas(
    x,
    weight,
    segment_ids=None,
    *,
    heads: int = 1,
    normalize: bool = False,
    eps: float = 1e-6,
    scale: float = 1.0,
    settings: ShortConvSettings = ShortConvSettings(),
):
    """``short_conv`` as the kernels above, launched as ``settings`` says (its ``impl`` is not
    read). x [B, T, C]; weight [W, C] (any float dtype, the gradient comes back in it);
    segment_ids [B, T] or None. T is padded to the tile."""
    B, T, C = x.shape
    W = weight.shape[0]
    interpret, block_t = settings.interpret, settings.block_t
    if interpret is not False and interpret is not True:
        raise ValueError(
            f"short_conv(impl='pallas'): interpret must be False or True (the "
            f"generic interpreter; there is no TPU layout), got {interpret!r}"
        )
    if interpret is False and settings.target() != "gpu":
        raise ValueError(
            f"short_conv(impl='pallas') has a Triton (GPU) lowering only; on "
            f"platform {settings.target()!r} use impl='reference' or "
            f"interpret=True"
        )
    X = C // heads
    if interpret is False:
        for name, n in (("channels per head", X), ("block_t", block_t)):
            if not pow2(n) or n < 16:
                raise ValueError(
                    f"short_conv(impl='pallas') on GPU needs {name} a power of two >= 16, got {n}"
                )
    bt = min(block_t, max(16, 1 << (T - 1).bit_length()))  # short sequences: one tile
    if W - 1 > bt:
        raise ValueError(
            f"short_conv(impl='pallas'): {W} taps reach {W - 1} rows back, past "
            f"a tile of {bt}; use block_t >= {W - 1}"
        )
    pad = (-T) % bt
    cfg = ConvConfig(
        width=W,
        block_t=bt,
        normalize=normalize,
        eps=eps,
        interpret=interpret,
        num_warps=settings.num_warps,
        scale=float(scale),
    )
    m = jnp.minimum(doc_offsets(segment_ids, B, T), W - 1).astype(f32)[..., None]
    Wp = 1 << (W - 1).bit_length()
    w = jnp.pad(weight.astype(f32), ((0, Wp - W), (0, 0)))
    xp = jnp.pad(x, ((0, 0), (0, pad), (0, 0))) if pad else x
    mp = jnp.pad(m, ((0, 0), (0, pad), (0, 0))) if pad else m
    y = _op(cfg, heads)(xp, w, mp)
    return y[:, :T] if pad else y
