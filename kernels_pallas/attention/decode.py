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
(four bytes a slot against the 2 x G x D x 2 the slot's keys and values take). With
``settings.fused`` the kernel forms that visibility itself from the slots' times, and a second
kernel (grid (B, G)) merges the splits and writes the output in q's dtype: three kernels a call
(q's padding, the two) in place of about eight, for steps of few rows x kv heads, where those
small XLA passes cost about as much as reading the cache. Splits are chosen so that B x G x
splits fills the device (``plan``). The slot count must be a multiple of 16 (Triton blocks are
powers of two); ``decode_attention`` sends other caches, steps of fewer than ``min_heads``
rows x kv heads (at batch 1 with a few kv heads the kernel measured no
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


def _kernel(q_ref, k_ref, v_ref, *refs, block, steps, scale, fused, window):
    q = q_ref[...]  # [ROWS, D]
    prec = jax.lax.Precision.HIGHEST if q.dtype == f32 else None
    if fused:  # the slots' times, the query's time and the row's start: visibility here
        kt_ref, qt_ref, ks_ref, o_ref, m_ref, l_ref = refs
        qt, ks = qt_ref[...], ks_ref[...]  # [1] each

        def seen_at(at):
            kt = kt_ref[at]
            seen = (kt >= 0) & (kt <= qt) & (kt >= ks)
            return seen if window is None else seen & (kt > qt - window)

    else:  # the visibility mask, formed in XLA
        vis_ref, o_ref, m_ref, l_ref = refs
        seen_at = lambda at: vis_ref[at] > 0

    def body(i, carry):
        m, l, acc = carry
        at = pl.ds(pl.multiple_of(i * block, block), block)
        k, v = k_ref[at, :], v_ref[at, :]  # [block, D]
        seen = seen_at(at)  # [block]
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


def _params(p: DecodePlan):
    if p.interpret is not False:
        return {}
    from jax.experimental.pallas import triton as plgpu

    return {"compiler_params": plgpu.CompilerParams(num_warps=p.num_warps, num_stages=p.num_stages)}


def _partials(qp, k, v, vis, p: DecodePlan, scale, window=None):
    """(o [B, G, N, ROWS, D], m, l [B, G, N, ROWS]) fp32 of N = S // (block * steps) splits.
    ``vis``: the [B, S] mask, or (k_time [S], q_time [1], k_start [B]) for the kernel to form
    it (``window`` then applies there)."""
    B, S, G, D = k.shape
    span, N = p.block * p.steps, p.splits(S)
    sq = pl.squeezed
    fused = isinstance(vis, tuple)
    kernel = functools.partial(
        _kernel, block=p.block, steps=p.steps, scale=scale, fused=fused, window=window
    )
    cache = pl.BlockSpec((sq, span, sq, D), lambda b, g, n: (b, n, g, 0))
    part = lambda *x: pl.BlockSpec((sq, sq, sq) + x, lambda b, g, n: (b, g, n) + (0,) * len(x))
    if fused:
        vis_specs = [
            pl.BlockSpec((span,), lambda b, g, n: (n,)),
            pl.BlockSpec((1,), lambda b, g, n: (0,)),
            pl.BlockSpec((1,), lambda b, g, n: (b,)),
        ]
    else:
        vis, vis_specs = (vis,), [pl.BlockSpec((sq, span), lambda b, g, n: (b, n))]
    return pl.pallas_call(
        kernel,
        grid=(B, G, N),
        in_specs=[pl.BlockSpec((sq, sq, ROWS, D), lambda b, g, n: (b, g, 0, 0)), cache, cache]
        + vis_specs,
        out_specs=[part(ROWS, D), part(ROWS), part(ROWS)],
        out_shape=[
            jax.ShapeDtypeStruct((B, G, N, ROWS, D), f32),
            jax.ShapeDtypeStruct((B, G, N, ROWS), f32),
            jax.ShapeDtypeStruct((B, G, N, ROWS), f32),
        ],
        interpret=p.interpret,
        name="decode_attention",
        **_params(p),
    )(qp, k, v, *vis)


def _merge_kernel(o_ref, m_ref, l_ref, out_ref):
    m, l = m_ref[...], l_ref[...]  # [N, R]
    top = jnp.max(m, axis=0)  # [R]
    w = jnp.exp(m - jnp.where(top > -jnp.inf, top, 0.0)[None, :])  # a split that saw nothing: 0
    total = jnp.sum(w * l, axis=0)
    out = jnp.sum(w[:, :, None] * o_ref[...], axis=0)  # [R, D]
    safe = jnp.where(total > 0, total, 1.0)
    out_ref[...] = jnp.where(total[:, None] > 0, out / safe[:, None], 0.0).astype(out_ref.dtype)


def _merge(o, m, l, R: int, dtype, p: DecodePlan):
    """``_combine`` as one kernel a (row, kv head), for the first R of its ROWS query rows:
    [B, G, R, D] in ``dtype`` (R and the split count powers of two: Triton's blocks)."""
    B, G, N, _, D = o.shape
    sq = pl.squeezed
    return pl.pallas_call(
        _merge_kernel,
        grid=(B, G),
        in_specs=[
            pl.BlockSpec((sq, sq, N, R, D), lambda b, g: (b, g, 0, 0, 0)),
            pl.BlockSpec((sq, sq, N, R), lambda b, g: (b, g, 0, 0)),
            pl.BlockSpec((sq, sq, N, R), lambda b, g: (b, g, 0, 0)),
        ],
        out_specs=pl.BlockSpec((sq, sq, R, D), lambda b, g: (b, g, 0, 0)),
        out_shape=jax.ShapeDtypeStruct((B, G, R, D), dtype),
        interpret=p.interpret,
        name="decode_attention_merge",
        **_params(p),
    )(o, m, l)


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
    pow2 = lambda n: n & (n - 1) == 0
    if settings.fused and pow2(R) and pow2(p.splits(S)):
        i32 = lambda x: jnp.asarray(x, jnp.int32)
        times = (i32(k_time), i32(q_time), i32(k_start))
        o, m, l = _partials(qp, k, v, times, p, scale, window)
        return _merge(o, m, l, R, q.dtype, p).reshape(B, 1, H, D)
    vis = cache_mask(q_time, k_time, k_start, window)[:, 0].astype(jnp.int32)  # [B, S]
    out = _combine(*_partials(qp, k, v, vis, p, scale))[:, :, :R]
    return out.reshape(B, 1, H, D).astype(q.dtype)
