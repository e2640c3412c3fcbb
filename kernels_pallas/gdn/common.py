"""What the GDN Pallas kernels share: launch settings, matmul helpers, the per-chunk launcher."""
from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

f32 = jnp.float32


@dataclasses.dataclass(frozen=True)
class KernelConfig:
    """How the GDN kernels are launched. ``layout``: "triton" | "tpu"; ``interpret``: False,
    True (generic interpreter) or a ``pltpu.InterpretParams``."""
    chunk: int
    layout: str
    block_v: int
    interpret: object = False
    num_warps: int = 4
    num_stages: int = 2
    chunk_warps: int = 4        # the one-chunk-per-program kernels (WY fwd / bwd, state grads)
    inverse_warps: int = 1      # of those, the WY inverse's (15 dependent reductions per block)
    chunk_block: int = 64       # their column block over K and V
    fp32_dots: str = "tf32"     # the WY backward's fp32 x fp32 [C, C] products: "tf32" | "ieee"
    recompute: bool = False     # backward recomputes w, QK, S_n, v from X instead of saving them


def _precision(dtype, fp32_dots):
    """fp32 operands: "ieee" -> HIGHEST (Triton's IEEE dot, no tensor cores), "tf32" -> DEFAULT
    (Triton: TF32 tensor cores; CPU and the interpreter: full fp32)."""
    if dtype != f32:
        return None
    return jax.lax.Precision.HIGHEST if fp32_dots == "ieee" else jax.lax.Precision.DEFAULT


def dot(a, b, trans_a=False, fp32_dots="ieee"):
    """a @ b (or a^T @ b) with fp32 accumulation; fp32 operands at ``fp32_dots`` precision."""
    prec = _precision(a.dtype, fp32_dots)
    dims = (((0,), (0,)), ((), ())) if trans_a else (((1,), (0,)), ((), ()))
    return jax.lax.dot_general(a, b, dims, precision=prec, preferred_element_type=f32)


def col_blocks(n, size):
    """Static slices covering n columns in equal blocks of at most ``size``."""
    size = math.gcd(n, size)
    return [pl.ds(j * size, size) for j in range(n // size)]


def dot_nt(a, b, fp32_dots="ieee"):
    """a @ b^T, fp32 accumulation."""
    prec = _precision(a.dtype, fp32_dots)
    return jax.lax.dot_general(a, b, (((1,), (1,)), ((), ())), precision=prec,
                               preferred_element_type=f32)


def compiler_params(cfg, num_warps=None):
    if cfg.interpret is not False and cfg.layout == "triton":
        return {}
    if cfg.layout == "tpu":
        from jax.experimental.pallas import tpu as pltpu
        return {"compiler_params": pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "parallel", "arbitrary"))}
    from jax.experimental.pallas import triton as plgpu
    return {"compiler_params": plgpu.CompilerParams(num_warps=num_warps or cfg.num_warps,
                                                    num_stages=cfg.num_stages)}


def chunk_call(cfg, kernel, ins, outs, btH, *, name, num_warps=None):
    """pallas_call of a one-chunk-per-program kernel.

    ins: (array, X) pairs, array [B, T, H, X] ("per token") or, with X None, [B, N, H, K, V]
    ("per chunk", one [K, V] block each); outs: (X, dtype) pairs of per-token outputs.
    Grid (B, N, H) on [B, T, H, X] arrays ("triton") or (B, H, N) on [B, H, T, X] ("tpu").
    ``num_warps``: this kernel's warps on GPU (default ``cfg.chunk_warps``).
    Returns the outputs in [B, T, H, X].
    """
    B, T, H = btH
    C, N, sq = cfg.chunk, T // cfg.chunk, pl.squeezed
    tpu = cfg.layout == "tpu"
    if tpu:
        from jax.experimental.pallas import tpu as pltpu
        grid = (B, H, N)
        tok = lambda X: pl.BlockSpec((sq, sq, C, X), lambda b, h, n: (b, h, n, 0))  # noqa: E731
        chk = lambda a: pl.BlockSpec((sq, sq, sq) + a.shape[3:],  # noqa: E731
                                     lambda b, h, n: (b, h, n, 0, 0))
        params = {"compiler_params": pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "parallel"))}
    else:
        grid = (B, N, H)
        tok = lambda X: pl.BlockSpec((sq, C, sq, X), lambda b, n, h: (b, n, h, 0))  # noqa: E731
        chk = lambda a: pl.BlockSpec((sq, sq, sq) + a.shape[3:],  # noqa: E731
                                     lambda b, n, h: (b, n, h, 0, 0))
        params = compiler_params(cfg, num_warps=num_warps or cfg.chunk_warps)
    swap = (lambda a: jnp.swapaxes(a, 1, 2)) if tpu else (lambda a: a)  # noqa: E731
    shape = (lambda X: (B, H, T, X)) if tpu else (lambda X: (B, T, H, X))  # noqa: E731
    res = pl.pallas_call(
        kernel, grid=grid,
        in_specs=[chk(a) if X is None else tok(X) for a, X in ins],
        out_specs=[tok(X) for X, _ in outs],
        out_shape=[jax.ShapeDtypeStruct(shape(X), dt) for X, dt in outs],
        interpret=cfg.interpret, name=name, **params,
    )(*(swap(a) for a, _ in ins))
    return tuple(swap(r) for r in res)
