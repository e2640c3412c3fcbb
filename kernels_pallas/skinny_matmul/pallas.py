"""``skinny_matmul`` as a Pallas (Triton) kernel: x [M, K] @ w [K, N] for a few rows M.

Same contract as ``reference.py``. A decode step multiplies one row (or a batch's few) by each
weight matrix: the product is the time to read w. XLA's GPU compiler makes a vector-matrix
product with a small matrix an elementwise multiply and a reduction, and its GEMMs of a few rows
tile only the columns: a 1024 x 1024 weight is 8-16 programs, each streaming all of K, far
from the bandwidth (docs/benchmarks.md, "Decode and cache"). Here:

  kernel   grid (column blocks, splits of K): each program streams its [K / splits, block_n]
           part of w in [block_k, block_n] tiles (a loop Triton pipelines) against x's
           columns; rows below 16 multiply on CUDA cores (a row's products summed down the
           tile), 16 and up on tensor cores; fp32 accumulation; columns past N masked
  combine  XLA: the splits' fp32 partial sums added (none when K is not split)

``plan`` splits K until the programs reach ``min_programs`` while the partial sums stay at
most half of w's bytes. The gradient is XLA's two products (``custom_vjp``). GPU only (Triton)
and the generic interpreter.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from kernels_pallas.skinny_matmul.reference import skinny_matmul_reference
from kernels_pallas.skinny_matmul.settings import SkinnyMatmulSettings

f32 = jnp.float32
DOT_ROWS = 16  # the fewest rows a Triton dot takes: fewer go to CUDA cores


@dataclasses.dataclass(frozen=True)
class MatmulPlan:
    """How the kernel is launched for one shape: ``rows`` (M rounded up to a power of two),
    ``block_n`` columns and ``splits`` of K a program's grid, ``block_k`` rows of w a loop
    step."""

    rows: int
    block_n: int
    block_k: int
    splits: int
    num_warps: int
    num_stages: int
    interpret: object = False


def plan(M: int, K: int, N: int, settings: SkinnyMatmulSettings) -> MatmulPlan | None:
    """The launch for x [M, K] @ w [K, N]; None (the reference) when M is above
    ``settings.max_rows`` or K is not a multiple of 16. Splits: powers of two, doubled while the
    programs are fewer than ``settings.min_programs``, a split keeps at least one tile and
    the fp32 partial sums (4 x splits x rows x N bytes) stay at most half of w's bf16 bytes."""
    if M > settings.max_rows or K % 16:
        return None
    rows = 1 << (max(M, 1) - 1).bit_length()  # M rounded up to a power of two
    bk = 16
    while bk * 2 <= settings.block_k and K % (bk * 2) == 0:
        bk *= 2
    cols = -(-N // settings.block_n)
    splits = 1
    while (
        cols * splits < settings.min_programs
        and splits * 2 <= K // bk
        and 4 * rows * splits * 2 <= K
    ):
        splits *= 2
    return MatmulPlan(
        rows,
        settings.block_n,
        bk,
        splits,
        settings.num_warps,
        settings.num_stages,
        settings.interpret,
    )


def _kernel(x_ref, w_ref, o_ref, *, p: MatmulPlan, N: int, blocks: int):
    j, s = pl.program_id(0), pl.program_id(1)
    bn, bk = p.block_n, p.block_k
    lo, hi = s * blocks // p.splits, (s + 1) * blocks // p.splits  # this split's tiles
    at_n = pl.ds(pl.multiple_of(j * bn, bn), bn)
    ok = j * bn + jax.lax.broadcasted_iota(jnp.int32, (1, bn), 1) < N

    def tile(i):
        k0 = pl.multiple_of(i * bk, bk)
        return k0, plgpu.load(w_ref.at[pl.ds(k0, bk), at_n], mask=ok, other=0)

    if p.rows >= DOT_ROWS:
        prec = jax.lax.Precision.HIGHEST if x_ref.dtype == f32 else None

        def body(i, acc):
            k0, w = tile(i)
            return acc + jax.lax.dot_general(
                x_ref[:, pl.ds(k0, bk)],
                w,
                (((1,), (0,)), ((), ())),
                precision=prec,
                preferred_element_type=f32,
            )

        accs = [jax.lax.fori_loop(lo, hi, body, jnp.zeros((p.rows, bn), f32))]
    else:

        def body(i, accs):
            k0, w = tile(i)
            w = w.astype(f32)
            return tuple(
                a + jnp.sum(x_ref[m, pl.ds(k0, bk)].astype(f32)[:, None] * w, axis=0, keepdims=True)
                for m, a in enumerate(accs)
            )

        accs = jax.lax.fori_loop(
            lo, hi, body, tuple(jnp.zeros((1, bn), f32) for _ in range(p.rows))
        )
    split = () if p.splits == 1 else (s,)
    step = p.rows // len(accs)
    for m, acc in enumerate(accs):
        plgpu.store(
            o_ref.at[split + (pl.ds(m * step, step), at_n)], acc.astype(o_ref.dtype), mask=ok
        )


def _call(p: MatmulPlan, x, w):
    """x [rows, K] @ w [K, N] -> [rows, N] in x's dtype."""
    rows, K = x.shape
    N = w.shape[1]
    shape = (rows, N) if p.splits == 1 else (p.splits, rows, N)
    params = {}
    if p.interpret is False:
        params = {
            "compiler_params": plgpu.CompilerParams(num_warps=p.num_warps, num_stages=p.num_stages)
        }
    whole = lambda a: pl.BlockSpec(a, lambda j, s: (0,) * len(a))  # indexed inside
    y = pl.pallas_call(
        functools.partial(_kernel, p=p, N=N, blocks=K // p.block_k),
        grid=(-(-N // p.block_n), p.splits),
        in_specs=[whole(x.shape), whole(w.shape)],
        out_specs=whole(shape),
        out_shape=jax.ShapeDtypeStruct(shape, x.dtype if p.splits == 1 else f32),
        interpret=p.interpret,
        name="skinny_matmul",
        **params,
    )(x, w)
    return y if p.splits == 1 else jnp.sum(y, axis=0).astype(x.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _product(p, x, w):
    return _call(p, x, w)


def _product_fwd(p, x, w):
    return _call(p, x, w), (x, w)


def _product_bwd(p, res, dy):
    x, w = res
    dx = jax.lax.dot_general(dy, w, (((1,), (1,)), ((), ())), preferred_element_type=f32)
    dw = jax.lax.dot_general(x, dy, (((0,), (0,)), ((), ())), preferred_element_type=f32)
    return dx.astype(x.dtype), dw.astype(w.dtype)


_product.defvjp(_product_fwd, _product_bwd)


def skinny_matmul_pallas(x, w, *, settings: SkinnyMatmulSettings = SkinnyMatmulSettings()):
    """x [..., K] @ w [K, N] -> [..., N] in x's dtype through the kernel; the reference where
    ``plan`` gives none. Rows are padded to a power of two (zeros) and sliced after."""
    lead, K = x.shape[:-1], x.shape[-1]
    M = math.prod(lead)
    p = plan(M, K, w.shape[1], settings)
    if p is None:
        return skinny_matmul_reference(x, w)
    x2 = x.reshape(M, K)
    if p.rows != M:
        x2 = jnp.pad(x2, ((0, p.rows - M), (0, 0)))
    y = _product(p, x2, w.astype(x.dtype))
    return (y if p.rows == M else y[:M]).reshape(lead + (w.shape[1],))
