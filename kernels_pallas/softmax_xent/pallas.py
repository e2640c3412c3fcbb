"""Softmax cross entropy with the logits' gradient as one Pallas (Triton) kernel.

Same contract and formulas as ``reference.py``. In XLA the training loss of a 50k vocabulary
is three passes over the [N, V] logits, each of the step's largest tensor: the forward's row
max and its row sum of exp (two reductions: XLA does not fuse a reduction into the one whose
result it needs), and the backward's softmax - one-hot.

Here one program takes ``block_rows`` rows and reads each twice in chunks of columns: once for
the running max and sum of exp (online, as flash attention's softmax), once to write d. A row
of 50,304 bf16 logits is 98 KiB, meant to be found in L2 by the second read (docs/benchmarks.md
has the kernel's time against XLA's passes). With
``input_output_aliases`` d overwrites the logits (a chunk is read before it is written, and
every read of a row's first pass precedes its second pass), so the step holds one [N, V] array
where autodiff held the logits and their gradient.

Triton blocks are powers of two: a row is covered by chunks of the widths in V's binary
expansion from ``block_v`` down (50,304 = 12 x 4096 + 1024 + 128), each a loop of whole
chunks, so no load is masked; V must be a multiple of ``MIN_WIDTH``. GPU only (Triton) and the
generic interpreter.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from kernels_pallas.softmax_xent.settings import SoftmaxXentSettings

f32 = jnp.float32
MIN_WIDTH = 16  # the narrowest chunk; V must be a multiple of it


@dataclasses.dataclass(frozen=True)
class XentConfig:
    """How the loss kernel is launched for one shape (``plan``)."""

    block_rows: int  # rows per program
    block_v: int  # the widest chunk of columns (a power of two)
    num_warps: int
    num_stages: int = 1
    interpret: object = False


def chunks(vocab: int, block_v: int) -> tuple[tuple[int, int, int], ...]:
    """((start, width, count), ...): V's columns as ``count`` chunks of ``width`` from
    ``start``, widths powers of two from ``block_v`` down to ``MIN_WIDTH``, each start a multiple
    of its width."""
    if vocab < MIN_WIDTH or vocab % MIN_WIDTH:
        raise ValueError(
            f"softmax_xent (pallas): the vocabulary must be a multiple of {MIN_WIDTH}, got {vocab}"
        )
    if block_v < MIN_WIDTH or block_v & (block_v - 1):
        raise ValueError(
            f"softmax_xent (pallas): block_v must be a power of two >= {MIN_WIDTH}, got {block_v}"
        )
    out, start, w = [], 0, block_v
    while start < vocab:
        count = (vocab - start) // w
        if count:
            out.append((start, w, count))
            start += count * w
        w //= 2
    return tuple(out)


def plan(
    n_rows: int,
    vocab: int,
    *,
    block_v: int = 4096,
    target: int = 4096,
    interpret=False,
    num_warps: int | None = None,
    num_stages: int = 1,
) -> XentConfig:
    """Chunks of up to ``block_v`` columns; rows a program: a power of two dividing n_rows with
    block_rows x the widest chunk at most ``target`` elements."""
    bv = block_v
    while bv > MIN_WIDTH and bv > vocab:
        bv //= 2
    br = 1
    while br * 2 * bv <= target and n_rows % (br * 2) == 0:
        br *= 2
    warps = num_warps or 4  # faster than 8 at the 380m step's shape (docs/benchmarks.md)
    return XentConfig(br, bv, warps, num_stages, interpret)


def _kernel(l_ref, t_ref, a_ref, b_ref, d_ref, nll_ref, logz_ref, *, pieces):
    t, a, b = t_ref[...], a_ref[...], b_ref[...]  # [BR, 1]
    BR = t.shape[0]

    def over_row(fn, carry):
        for start, w, count in pieces:

            def body(j, c, start=start, w=w):
                col = pl.multiple_of(start + j * w, w)
                return fn(pl.ds(col, w), col, w, c)

            carry = jax.lax.fori_loop(0, count, body, carry)
        return carry

    def stats(cols, col, w, carry):  # running max and sum of exp
        m, s = carry
        x = l_ref[:, cols].astype(f32)
        m_new = jnp.maximum(m, jnp.max(x, axis=1, keepdims=True))
        s = s * jnp.exp(m - m_new) + jnp.sum(jnp.exp(x - m_new), axis=1, keepdims=True)
        return m_new, s

    m, s = over_row(stats, (jnp.full((BR, 1), -jnp.inf, f32), jnp.zeros((BR, 1), f32)))
    logz = m + jnp.log(s)
    c = a + b * logz

    def grad(cols, col, w, gold):  # d, and the target's logit
        x = l_ref[:, cols].astype(f32)
        hit = col + jax.lax.broadcasted_iota(jnp.int32, (BR, w), 1) == t
        d = jnp.exp(x - logz) * c - jnp.where(hit, a, 0.0)
        d_ref[:, cols] = d.astype(d_ref.dtype)
        return gold + jnp.sum(jnp.where(hit, x, 0.0), axis=1, keepdims=True)

    gold = over_row(grad, jnp.zeros((BR, 1), f32))
    nll_ref[...] = logz - gold
    logz_ref[...] = logz


def _params(cfg):
    if cfg.interpret is not False:
        return {}
    from jax.experimental.pallas import triton as plgpu

    return {
        "compiler_params": plgpu.CompilerParams(num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    }


@functools.partial(jax.jit, static_argnums=(0,))
def _call(cfg, logits, targets, a, b):
    N, V = logits.shape
    BR = cfg.block_rows
    rows = pl.BlockSpec((BR, V), lambda i: (i, 0))
    col = pl.BlockSpec((BR, 1), lambda i: (i, 0))
    d, nll, logz = pl.pallas_call(
        functools.partial(_kernel, pieces=chunks(V, cfg.block_v)),
        grid=(N // BR,),
        in_specs=[rows, col, col, col],
        out_specs=[rows, col, col],
        out_shape=[
            jax.ShapeDtypeStruct((N, V), logits.dtype),
            jax.ShapeDtypeStruct((N, 1), f32),
            jax.ShapeDtypeStruct((N, 1), f32),
        ],
        input_output_aliases={0: 0},
        interpret=cfg.interpret,
        name="softmax_xent",
        **_params(cfg),
    )(logits, targets[:, None].astype(jnp.int32), a[:, None].astype(f32), b[:, None].astype(f32))
    return nll[:, 0], logz[:, 0], d


def softmax_xent_pallas(
    logits, targets, a, b, *, settings: SoftmaxXentSettings = SoftmaxXentSettings()
):
    """logits [N, V], targets [N] int, a, b [N] -> (nll [N] fp32, logZ [N] fp32, d [N, V] in
    the logits' dtype); ``reference.py`` states the formulas. Not differentiable: d is the
    gradient the caller's VJP returns. Launched as ``settings`` says (its ``impl`` not read)."""
    if settings.interpret is False and settings.target() != "gpu":
        raise ValueError(
            f"softmax_xent(impl='pallas') has a Triton (GPU) lowering only; on "
            f"platform {settings.target()!r} use impl='reference' or "
            f"interpret=True"
        )
    cfg = plan(
        *logits.shape,
        block_v=settings.block_v,
        interpret=settings.interpret,
        num_warps=settings.num_warps,
        num_stages=settings.num_stages,
    )
    return _call(cfg, logits, targets, a, b)
