"""What the chunked linear-recurrence Pallas kernels share: launch settings and layout, matmul
helpers, the per-chunk launcher, padding and chunk-local cumulative sums."""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from kernels_pallas.dispatch import pow2

f32 = jnp.float32


@dataclasses.dataclass(frozen=True)
class KernelConfig:
    """How the chunked kernels are launched. ``layout``: "triton" | "tpu"; ``interpret``: False,
    True (generic interpreter) or a ``pltpu.InterpretParams``."""

    chunk: int
    layout: str
    block_v: int
    interpret: object = False
    num_warps: int = 4
    num_stages: int = 2
    chunk_warps: int = 4  # the one-chunk-per-program kernels (WY fwd / bwd, state grads)
    inverse_warps: int = 1  # of those, the WY inverse's (15 dependent reductions per block)
    chunk_block: int = 64  # their column block over K and V
    intra_block: int = 64  # the per-key intra-chunk scores' key columns per matmul
    fp32_dots: str = "tf32"  # the WY backward's fp32 x fp32 [C, C] products: "tf32" | "ieee"
    recompute: bool = False  # backward recomputes w, QK, S_n, v from X instead of saving them
    wy_apply: str = "triton"  # GDN's w, u, QK kernel on GPU: "triton" | "mosaic" (Mosaic GPU)


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
    return jax.lax.dot_general(
        a, b, (((1,), (1,)), ((), ())), precision=prec, preferred_element_type=f32
    )


def compiler_params(cfg, num_warps=None):
    if cfg.interpret is not False and cfg.layout == "triton":
        return {}
    if cfg.layout == "tpu":
        from jax.experimental.pallas import tpu as pltpu

        return {
            "compiler_params": pltpu.CompilerParams(
                dimension_semantics=("parallel", "parallel", "parallel", "arbitrary")
            )
        }
    from jax.experimental.pallas import triton as plgpu

    return {
        "compiler_params": plgpu.CompilerParams(
            num_warps=num_warps or cfg.num_warps, num_stages=cfg.num_stages
        )
    }


def ref_rows(ref, t):
    """ref[t, :], or None for an absent input (w without the delta rule)."""
    return None if ref is None else ref[t, :]


def ref_all(ref):
    """ref[...], or None for an absent input."""
    return None if ref is None else ref[...]


def with_absent(kernel, present):
    """``kernel`` for a call without some of its leading refs: ``present`` flags its first
    len(present) refs; the absent ones reach ``kernel`` as None, the rest in order."""

    def run(*refs, **kw):
        it = iter(refs)
        return kernel(*(next(it) if p else None for p in present), *it, **kw)

    return run


def chunk_call(cfg, kernel, ins, outs, btH, *, name, num_warps=None, aliases=None):
    """pallas_call of a one-chunk-per-program kernel.

    ins: (array, X) pairs, array [B, T, H, X] ("per token") or, with X None, [B, N, H, K, V]
    ("per chunk", one [K, V] block each); outs: (X, dtype) pairs of per-token outputs. An
    input whose array is None or an output whose dtype is None is absent: the kernel sees None
    for its ref, and None is returned for the output.
    Grid (B, N, H) on [B, T, H, X] arrays ("triton") or (B, H, N) on [B, H, T, X] ("tpu").
    ``num_warps``: this kernel's warps on GPU (default ``cfg.chunk_warps``); ``aliases``: {input
    index: output index} of outputs written over an input (a kernel that updates some chunks
    of an earlier kernel's output; every input present).
    Returns the outputs in [B, T, H, X].
    """
    present = [a is not None for a, _ in ins] + [dt is not None for _, dt in outs]
    if not all(present):
        if aliases:
            raise ValueError(f"chunk_call({name}): aliases need every input and output present")
        kernel = with_absent(kernel, present)
        res = iter(
            chunk_call(
                cfg,
                kernel,
                [i for i in ins if i[0] is not None],
                [o for o in outs if o[1] is not None],
                btH,
                name=name,
                num_warps=num_warps,
            )
        )
        return tuple(None if dt is None else next(res) for _, dt in outs)
    B, T, H = btH
    C, N, sq = cfg.chunk, T // cfg.chunk, pl.squeezed
    tpu = cfg.layout == "tpu"
    if tpu:
        from jax.experimental.pallas import tpu as pltpu

        grid = (B, H, N)
        tok = lambda X: pl.BlockSpec((sq, sq, C, X), lambda b, h, n: (b, h, n, 0))
        chk = lambda a: pl.BlockSpec((sq, sq, sq) + a.shape[3:], lambda b, h, n: (b, h, n, 0, 0))
        params = {
            "compiler_params": pltpu.CompilerParams(
                dimension_semantics=("parallel", "parallel", "parallel")
            )
        }
    else:
        grid = (B, N, H)
        tok = lambda X: pl.BlockSpec((sq, C, sq, X), lambda b, n, h: (b, n, h, 0))
        chk = lambda a: pl.BlockSpec((sq, sq, sq) + a.shape[3:], lambda b, n, h: (b, n, h, 0, 0))
        params = compiler_params(cfg, num_warps=num_warps or cfg.chunk_warps)
    swap = (lambda a: jnp.swapaxes(a, 1, 2)) if tpu else (lambda a: a)
    shape = (lambda X: (B, H, T, X)) if tpu else (lambda X: (B, T, H, X))
    res = pl.pallas_call(
        kernel,
        grid=grid,
        in_specs=[chk(a) if X is None else tok(X) for a, X in ins],
        out_specs=[tok(X) for X, _ in outs],
        out_shape=[jax.ShapeDtypeStruct(shape(X), dt) for X, dt in outs],
        interpret=cfg.interpret,
        name=name,
        input_output_aliases=aliases or {},
        **params,
    )(*(swap(a) for a, _ in ins))
    return tuple(swap(r) for r in res)


def scan_specs(cfg, B, H, T, K, V, *, reverse=False, transposed=False):
    """Grid and BlockSpecs of a sequential scan over chunks in ``cfg.layout``: "seq"(X), a
    per-token array's block of X columns; "seq_v", its block of the program's BV value columns;
    "state", the program's block of a [B, H, K, V] state ([B, H, V, K] when ``transposed``);
    "chunks", of the per-chunk states [B, N, H, K, V] ([B, H, N, ...] for "tpu"). "triton":
    grid (B, H, V/BV), whole sequences per program; "tpu": grid (B, H, V/BV, N), one chunk per
    step, the chunks walked down with ``reverse``."""
    C, BV, sq = cfg.chunk, cfg.block_v, pl.squeezed
    N = T // C
    st = (BV, K) if transposed else (K, BV)
    at_v = (lambda j: (j, 0)) if transposed else (lambda j: (0, j))
    if cfg.layout == "triton":
        return dict(
            grid=(B, H, V // BV),
            seq=lambda X: pl.BlockSpec((sq, T, sq, X), lambda b, h, j: (b, 0, h, 0)),
            seq_v=pl.BlockSpec((sq, T, sq, BV), lambda b, h, j: (b, 0, h, j)),
            state=pl.BlockSpec((sq, sq) + st, lambda b, h, j: (b, h) + at_v(j)),
            chunks=pl.BlockSpec((sq, N, sq) + st, lambda b, h, j: (b, 0, h) + at_v(j)),
        )
    at = (lambda i: N - 1 - i) if reverse else (lambda i: i)
    return dict(
        grid=(B, H, V // BV, N),
        seq=lambda X: pl.BlockSpec((sq, sq, C, X), lambda b, h, j, n: (b, h, at(n), 0)),
        seq_v=pl.BlockSpec((sq, sq, C, BV), lambda b, h, j, n: (b, h, at(n), j)),
        state=pl.BlockSpec((sq, sq) + st, lambda b, h, j, n: (b, h) + at_v(j)),
        chunks=pl.BlockSpec((sq, sq, sq) + st, lambda b, h, j, n: (b, h, at(n)) + at_v(j)),
    )


def column(x):
    """x [B, T, H] as [B, T, H, 1], a per-token input of one column (None stays None: absent)."""
    return None if x is None else x[..., None]


def pad_time(x, pad):
    """x [B, T, ...] with ``pad`` zeros after its last token."""
    if pad == 0:
        return x
    widths = [(0, 0)] * x.ndim
    widths[1] = (0, pad)
    return jnp.pad(x, widths)


def chunk_local_cumsum(g, chunk_size):
    """g [B, N*C, H, ...] -> chunk-local inclusive cumulative sum, same shape."""
    B, T = g.shape[:2]
    return jnp.cumsum(g.reshape(B, T // chunk_size, chunk_size, *g.shape[2:]), axis=2).reshape(
        g.shape
    )


def _cumsum_kernel(x_ref, o_ref, *, triton):
    x = x_ref[...].astype(f32)
    if triton:
        o = jnp.cumsum(x, axis=0)
    else:  # Mosaic has no cumsum: a lower-triangular product
        n = x.shape[0]
        lower = jax.lax.broadcasted_iota(jnp.int32, (n, n), 0) >= jax.lax.broadcasted_iota(
            jnp.int32, (n, n), 1
        )
        o = dot(lower.astype(f32), x, fp32_dots="ieee")
    o_ref[...] = o


def chunk_local_cumsum_pallas(cfg, x):
    """``chunk_local_cumsum`` of x [B, T, H, X] (T a multiple of ``cfg.chunk``) as one Pallas
    kernel, fp32: one program a chunk and head."""
    B, T, H, X = x.shape
    kernel = functools.partial(_cumsum_kernel, triton=cfg.layout == "triton")
    return chunk_call(cfg, kernel, [(x, X)], [(X, f32)], (B, T, H), name="chunk_cumsum")[0]


def chunked(x, chunk_size):
    """[B, N*C, H, X] -> [B, N, H, C, X]: each chunk of each head as one [C, X] block."""
    B, T, H, X = x.shape
    return x.reshape(B, T // chunk_size, chunk_size, H, X).transpose(0, 1, 3, 2, 4)


def reverse_chunk_cumsum(x, chunk_size):
    """x [B, N*C, H, ...] -> the sum over each position and the later ones of its chunk (the
    cotangent of ``chunk_local_cumsum``)."""
    B, T = x.shape[:2]
    x = x.reshape(B, T // chunk_size, chunk_size, *x.shape[2:])
    return jnp.flip(jnp.cumsum(jnp.flip(x, 2), 2), 2).reshape(B, T, *x.shape[3:])


def layout(settings) -> str:
    """ "triton" or "tpu": the kernels' memory layout and lowering for a ``KernelSettings``."""
    interpret = settings.interpret
    if interpret is False or interpret is None:
        platform = settings.target()
        if platform in ("gpu", "tpu"):
            return "triton" if platform == "gpu" else "tpu"
        raise ValueError(
            f"{settings.OP}(impl='pallas') has no compiled lowering on platform "
            f"{platform!r}: set interpret=True (generic interpreter) or "
            f"interpret=pltpu.InterpretParams() (TPU semantics) in its settings"
        )
    if interpret is True:
        return "triton"
    from jax.experimental.pallas import tpu as pltpu

    if isinstance(interpret, pltpu.InterpretParams):
        return "tpu"
    raise ValueError(
        f"{settings.OP}: interpret must be False, True or a "
        f"pltpu.InterpretParams, got {interpret!r}"
    )


def default_block_v(layout, B, H, K, V, programs=128):
    """Value columns per program of the sequential scan. "tpu": V, or 128 when it divides V.
    "triton": the largest power of two dividing V, at most 64, halved (down to 16) while the
    grid B x H x V/block has fewer than ``programs`` programs (about one per SM of an H200),
    since the scan's speed is the latency of its chunk loop times the waves of programs."""
    if layout == "tpu":
        return 128 if V % 128 == 0 else V
    bv = min(64, V & -V)
    while bv > 16 and B * H * (V // bv) < programs:
        bv //= 2
    return bv


def default_num_stages(B, H, V, block_v, programs=128):
    """Triton's pipeline depth of the scans: 3 while the grid B x H x V/block_v has at most
    ``programs`` programs (about one per SM of an H200), else 2. With one program an SM, a
    deeper pipeline hides more of the chunk loop's load latency and its shared memory keeps no
    second program out; with more, the third stage's buffers cost programs an SM
    (docs/benchmarks.md, "GDN kernels against fla"). The op's one-chunk kernels launch with the
    same value; having no loop to pipeline, they do not change with it."""
    return 3 if B * H * (V // block_v) <= programs else 2


def triton_takes(n: int) -> bool:
    """Whether the Triton kernels take n as a key width or chunk size: a power of two >= 16."""
    return pow2(n) and n >= 16


def kernel_config(settings, B, H, K, V, **launch) -> KernelConfig:
    """The ``KernelConfig`` of a chunked op's ``settings`` (``chunk_size``, ``block_v``,
    ``interpret`` and the launch fields named in ``launch``) for [B, T, H, K] keys and V value
    columns: the layout, the scan's value block, num_stages None as ``default_num_stages``, and
    on GPU the power-of-two shapes Triton needs, refused by name."""
    C = settings.chunk_size
    lay = layout(settings)
    bv = default_block_v(lay, B, H, K, V) if settings.block_v is None else settings.block_v
    if V % bv:
        raise ValueError(f"{settings.OP}(impl='pallas'): block_v={bv} does not divide V={V}")
    if lay == "triton" and settings.interpret is not True:
        for name, n in (("K", K), ("block_v", bv), ("chunk_size", C)):
            if not (pow2(n) if name == "block_v" else triton_takes(n)):
                raise ValueError(
                    f"{settings.OP}(impl='pallas') on GPU needs {name} a power "
                    f"of two >= 16, got {n}"
                )
    if launch.get("num_stages", 2) is None:
        launch["num_stages"] = default_num_stages(B, H, V, bv)
    return KernelConfig(chunk=C, layout=lay, block_v=bv, interpret=settings.interpret, **launch)
