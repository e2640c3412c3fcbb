"""One new query token per row over a KV cache (a decode step), split over the cache's slots as
a Pallas (Triton) kernel: ``decode_attention``.

Same contract as ``reference.cached_attention`` with T = 1 (the specification). A decode step
reads the whole cache and computes little with it, so its speed is the bandwidth at which the
cache is read. The reference upcasts the bf16 cache to fp32 for its full-precision logits, and
XLA forms the logits, the softmax and p V as separate passes. Here:

  kernel   grid (B, G, splits): each program streams its share of one kv head's slots, in
           blocks of ``block`` slots (a loop Triton pipelines), through the online softmax of
           flash attention: logits q k^T and p V on tensor cores in the cache's dtype with fp32
           accumulation (the group's R query heads padded to 16 rows, the least a Triton dot
           takes), probabilities rounded to the values' dtype before p V as cuDNN's attention
           does; it writes its running max, sum and unnormalised output (fp32)
  combine  XLA: the splits' partial softmaxes merged (rescaled to their common max)

which slots a query may see (times, left padding, a window) is one [B, S] mask computed in XLA
(four bytes a slot against the 2 x G x D x 2 the slot's keys and values take). Splits are
chosen so that B x G x splits fills the device (``plan``). The slot count must be a multiple of
16 (Triton blocks are powers of two); ``decode_attention`` sends other caches, steps of fewer
than ``min_heads`` rows x kv heads (at batch 1 with a few kv heads the kernel measured no
faster), and every platform but the GPU, to the reference. GPU only (Triton) and the generic
interpreter.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from kernels_pallas import dispatch
from kernels_pallas.attention.reference import cache_mask, cached_attention
from kernels_pallas.attention.settings import DecodeAttentionSettings

f32 = jnp.float32
ROWS = 16  # query rows of a program's dot: the group's heads, zero-padded


@dataclasses.dataclass(frozen=True)
class DecodePlan:
    """How the kernel is launched for one shape: ``block`` slots a loop step, ``steps`` loop
    steps a program, so ``S // (block * steps)`` splits."""

    block: int
    steps: int
    num_warps: int
    num_stages: int
    interpret: object = False

    def splits(self, S: int) -> int:
        return S // (self.block * self.steps)


def plan(B: int, G: int, S: int, settings: DecodeAttentionSettings) -> DecodePlan | None:
    """The launch for B rows, G kv heads, S slots; None (the reference) when S is not a
    multiple of 16 or B x G is below ``settings.min_heads``. The
    block: ``settings.block`` or the largest power of two <= it dividing S; steps: the most
    (a power of two) that keep at least ``settings.min_programs`` programs, and at least as
    many as bring the splits to ``settings.max_splits`` (the merge, in XLA, is one serial sum
    over the splits per output; with few rows and heads it has little else to spread over)."""
    if S % 16 or B * G < settings.min_heads:
        return None
    block = 16
    while block * 2 <= settings.block and S % (block * 2) == 0:
        block *= 2
    steps = 1
    while S % (block * steps * 2) == 0 and (
        B * G * (S // (block * steps * 2)) >= settings.min_programs
        or S // (block * steps) > settings.max_splits
    ):
        steps *= 2
    return DecodePlan(block, steps, settings.num_warps, settings.num_stages, settings.interpret)


def _kernel(q_ref, k_ref, v_ref, vis_ref, o_ref, m_ref, l_ref, *, block, steps, scale):
    q = q_ref[...]  # [ROWS, D]
    prec = jax.lax.Precision.HIGHEST if q.dtype == f32 else None

    def body(i, carry):
        m, l, acc = carry
        at = pl.ds(pl.multiple_of(i * block, block), block)
        k, v = k_ref[at, :], v_ref[at, :]  # [block, D]
        seen = vis_ref[at] > 0  # [block]
        s = (
            jax.lax.dot_general(
                q, k, (((1,), (1,)), ((), ())), precision=prec, preferred_element_type=f32
            )
            * scale
        )  # [ROWS, block]
        s = jnp.where(seen[None, :], s, -jnp.inf)
        m_new = jnp.maximum(m, jnp.max(s, axis=1))
        base = jnp.where(m_new > -jnp.inf, m_new, 0.0)  # nothing seen yet: any finite base
        p = jnp.exp(s - base[:, None])  # unseen: exp(-inf) = 0
        corr = jnp.exp(m - base)
        pv = jax.lax.dot_general(
            p.astype(v.dtype),
            v,
            (((1,), (0,)), ((), ())),
            precision=prec,
            preferred_element_type=f32,
        )
        return m_new, l * corr + jnp.sum(p, axis=1), acc * corr[:, None] + pv

    D = q.shape[-1]
    init = (jnp.full((ROWS,), -jnp.inf, f32), jnp.zeros((ROWS,), f32), jnp.zeros((ROWS, D), f32))
    m, l, acc = jax.lax.fori_loop(0, steps, body, init)
    o_ref[...] = acc
    m_ref[...] = m
    l_ref[...] = l


def _partials(qp, k, v, vis, p: DecodePlan, scale):
    """(o [B, G, N, ROWS, D], m, l [B, G, N, ROWS]) fp32 of N = S // (block * steps) splits."""
    B, S, G, D = k.shape
    span, N = p.block * p.steps, p.splits(S)
    sq = pl.squeezed
    kernel = functools.partial(_kernel, block=p.block, steps=p.steps, scale=scale)
    params = {}
    if p.interpret is False:
        from jax.experimental.pallas import triton as plgpu

        params = {
            "compiler_params": plgpu.CompilerParams(num_warps=p.num_warps, num_stages=p.num_stages)
        }
    cache = pl.BlockSpec((sq, span, sq, D), lambda b, g, n: (b, n, g, 0))
    part = lambda *x: pl.BlockSpec((sq, sq, sq) + x, lambda b, g, n: (b, g, n) + (0,) * len(x))
    return pl.pallas_call(
        kernel,
        grid=(B, G, N),
        in_specs=[
            pl.BlockSpec((sq, sq, ROWS, D), lambda b, g, n: (b, g, 0, 0)),
            cache,
            cache,
            pl.BlockSpec((sq, span), lambda b, g, n: (b, n)),
        ],
        out_specs=[part(ROWS, D), part(ROWS), part(ROWS)],
        out_shape=[
            jax.ShapeDtypeStruct((B, G, N, ROWS, D), f32),
            jax.ShapeDtypeStruct((B, G, N, ROWS), f32),
            jax.ShapeDtypeStruct((B, G, N, ROWS), f32),
        ],
        interpret=p.interpret,
        name="decode_attention",
        **params,
    )(qp, k, v, vis)


def _combine(o, m, l):
    """The splits' partial softmaxes merged: [B, G, ROWS, D]; rows that saw no key: zeros."""
    top = jnp.max(m, axis=2, keepdims=True)
    w = jnp.exp(m - jnp.where(top > -jnp.inf, top, 0.0))  # a split that saw nothing: 0
    total = jnp.sum(w * l, axis=2)
    out = jnp.sum(w[..., None] * o, axis=2)
    return jnp.where(total[..., None] > 0, out / jnp.where(total > 0, total, 1.0)[..., None], 0.0)


def decode_attention(
    q,
    k,
    v,
    *,
    q_time,
    k_time,
    k_start,
    window=None,
    scale=None,
    settings: DecodeAttentionSettings | None = None,
):
    """q [B, 1, H, D] at time ``q_time`` [1]; k/v [B, S, G, D] at times ``k_time`` [S] (-1 =
    empty slot); ``k_start`` [B]. Key s is visible iff k_start <= k_time[s] <= q_time (and,
    with a window, k_time[s] > q_time - window). A row with no visible key returns zeros.
    Returns [B, 1, H, D] in q's dtype. ``settings`` chooses the implementation (module
    docstring); a query of more than one token raises (prefill: ``cached_attention_blockwise``).
    """
    settings = DecodeAttentionSettings() if settings is None else settings
    B, T, H, D = q.shape
    S, G = k.shape[1], k.shape[2]
    if T != 1:
        raise ValueError(
            f"decode_attention: one query token a row, got q of shape {q.shape} "
            f"(prefill chunks go through cached_attention_blockwise)"
        )
    if H % G or H // G > ROWS:
        raise ValueError(
            f"decode_attention: {H} query heads over {G} kv heads: need a "
            f"multiple, at most {ROWS} query heads a kv head"
        )
    impl = settings.choose()
    p = plan(B, G, S, settings) if impl == "pallas" else None
    impl = dispatch.record(settings, "pallas" if p is not None else "reference")
    kw = dict(q_time=q_time, k_time=k_time, k_start=k_start, window=window, scale=scale)
    if impl == "reference":
        return cached_attention(q, k, v, **kw)
    scale = D**-0.5 if scale is None else scale
    R = H // G
    qp = jnp.pad(q.reshape(B, G, R, D).astype(k.dtype), ((0, 0), (0, 0), (0, ROWS - R), (0, 0)))
    vis = cache_mask(q_time, k_time, k_start, window)[:, 0].astype(jnp.int32)  # [B, S]
    out = _combine(*_partials(qp, k, v, vis, p, scale))[:, :, :R]
    return out.reshape(B, 1, H, D).astype(q.dtype)
