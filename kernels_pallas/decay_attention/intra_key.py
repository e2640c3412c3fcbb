"""The intra-chunk scores of linear attention with a decay per key dimension (GLA, HGRN-2), as
Pallas kernels with their own backward: ``intra_scores(cfg, q, k, G)``.

Per chunk of C tokens, with G [C, K] the chunk-local cumulative log decay (non-increasing down
the chunk),

    A_ij = sum_k q_ik k_jk exp(G_ik - G_jk)   for j <= i, 0 above the diagonal.

The decay does not factor out of the sum, and neither factor e^{G_i}, e^{-G_j} alone is bounded,
so the query rows are taken in sub-chunks of c = 16 (``SUB``), one program each (grid (B, N C/c,
H); each program reads its rows and its whole chunk), and every exponent stays <= 0:

  keys before the sub-chunk    one matmul, (q_i e^{G_i - G_r}) (k_j e^{G_r - G_j})^T, with G_r
                               the sub-chunk's first row (G_i <= G_r <= G_j);
  keys inside it               a loop over its c keys j: the column sum_k q_ik k_jk e^{G_ik -
                               G_jk} of the [c, K] weights e^{G_i - G_j} (i >= j).

The backward takes dA [C, C] and gives a sub-chunk's rows of dq (from its rows of dA: the
earlier keys by one matmul, against G_r) and of dk (from its columns of dA: the later queries,
against the sub-chunk's last row of G), and its own block in one loop over its keys j sharing
each weight e^{G_i - G_j} between dq_i (+= dA_ij k_j e) and dk_j (+= sum_i dA_ij q_i e); then
dG = q dq - k dk (d exp(G_i - G_j) / dG_i = +, / dG_j = -). It adds the other gradient paths'
dq, dk, dG where given and writes each once, dq times a scale, in the dtypes asked for, so the
op's gradients leave the kernel whole. A sub-chunk's diagonal block and columns of dA are taken
by exact products with a 0/1 placement matrix, the same on both layouts.

``bench/triton_regs.py --ops decay_key`` gives the kernels' registers and layout conversions
without a GPU. Both layouts ([B, T, H, X] with grid (B, N C/c, H) for Triton, [B, H, T, X] with
(B, H, N C/c) for Mosaic TPU) are tested interpreted and lower for their compilers
(``tests/test_export.py``); the Triton one runs on GPUs, the Mosaic one has not run on a TPU.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from kernels_pallas.linear_scan.common import (col_blocks, compiler_params, dot, dot_nt, f32,
                                               with_absent)

SUB = 16                    # query rows of a sub-chunk: one program
BLOCK = 32                  # key columns at a time


def _masked_exp(x, keep):
    """exp(x) where ``keep``, else 0 (masked before exp: the dropped entries may be > 0)."""
    return jnp.where(keep, jnp.exp(jnp.where(keep, x, 0.0)), 0.0)


def _iota(shape, axis):
    return jax.lax.broadcasted_iota(jnp.int32, shape, axis)


def _sub_start(sub_axis, chunk, sub):
    """The first row, within its chunk, of this program's sub-chunk."""
    return jax.lax.rem(pl.program_id(sub_axis), chunk // sub) * sub   # ids >= 0: rem, not %


def _placement(r, chunk, sub):
    """P [C, c] fp32, P_tj = 1 where t = r + j: x P takes a sub-chunk's columns of x [., C],
    y P^T places y [., c] at them, exactly (one nonzero term a sum)."""
    return (_iota((chunk, sub), 0) == _iota((chunk, sub), 1) + r).astype(f32)


def _fwd_kernel(q_ref, k_ref, g_ref, kc_ref, gc_ref, a_ref, *, chunk, blk, sub_axis, unroll,
                fp32_dots):
    """A sub-chunk's rows of A [c, C] from its rows of q, k, G (q_ref, k_ref, g_ref [c, K]) and
    its chunk's k, G (kc_ref, gc_ref [C, K])."""
    dt = q_ref.dtype
    sub, K = q_ref.shape
    r = _sub_start(sub_axis, chunk, sub)
    rows, cols = _iota((sub, 1), 0), _iota((sub, sub), 1)
    acc = jnp.zeros((sub, chunk), f32)
    diag = jnp.zeros((sub, sub), f32)
    for ck in col_blocks(K, blk):
        q, g, g0 = q_ref[:, ck].astype(f32), g_ref[:, ck], g_ref[pl.ds(0, 1), ck]
        before = _iota((chunk, ck.size), 0) < r          # keys before: G_i <= G_r <= G_j
        kb = kc_ref[:, ck].astype(f32) * _masked_exp(g0 - gc_ref[:, ck], before)
        acc += dot_nt((q * jnp.exp(g - g0)).astype(dt), kb.astype(dt), fp32_dots)

        def key(j, diag, q=q, g=g, ck=ck):               # keys inside: column j
            w = _masked_exp(g - g_ref[pl.ds(j, 1), ck], rows >= j)
            col = jnp.sum(q * k_ref[pl.ds(j, 1), ck].astype(f32) * w, axis=1, keepdims=True)
            return diag + jnp.where(cols == j, col, 0.0)

        diag = jax.lax.fori_loop(0, sub, key, diag, unroll=unroll)
    place = (_iota((sub, chunk), 1) == _iota((sub, chunk), 0) + r).astype(f32)   # P^T
    a_ref[...] = (acc + dot(diag, place, fp32_dots="ieee")).astype(a_ref.dtype)


def _bwd_kernel(q_ref, k_ref, g_ref, qc_ref, kc_ref, gc_ref, da_ref, dac_ref,
                dq_in_ref, dk_in_ref, dg_in_ref, dq_ref, dk_ref, dg_ref, *, chunk, blk,
                sub_axis, unroll, fp32_dots, scale):
    """A sub-chunk's rows of dq, dk, dG from its rows of q, k, G and of dA (da_ref [c, C]) and
    its chunk's q, k, G and dA (dac_ref [C, C]); the other paths' dq, dk, dG (``*_in_ref``, None:
    absent) added, dq times ``scale``."""
    dt = q_ref.dtype
    sub, K = q_ref.shape
    r = _sub_start(sub_axis, chunk, sub)
    P = _placement(r, chunk, sub)
    dA_d = dot(da_ref[...], P, fp32_dots="ieee")                   # [c, c] its diagonal block
    dA_c = dot(dac_ref[...].astype(dt), P.astype(dt)).astype(dt)   # [C, c] its columns
    rows, cols = _iota((sub, 1), 0), _iota((sub, sub), 1)
    for ck in col_blocks(K, blk):
        n = ck.size
        q, k, g = q_ref[:, ck].astype(f32), k_ref[:, ck].astype(f32), g_ref[:, ck]
        g0, gl = g_ref[pl.ds(0, 1), ck], g_ref[pl.ds(sub - 1, 1), ck]
        pos = _iota((chunk, n), 0)
        kb = kc_ref[:, ck].astype(f32) * _masked_exp(g0 - gc_ref[:, ck], pos < r)
        dq = dot(da_ref[...].astype(dt), kb.astype(dt), fp32_dots=fp32_dots) * jnp.exp(g - g0)
        qa = qc_ref[:, ck].astype(f32) * _masked_exp(gc_ref[:, ck] - gl, pos >= r + sub)
        dk = dot(dA_c, qa.astype(dt), trans_a=True, fp32_dots=fp32_dots) * jnp.exp(gl - g)

        def key(j, carry, q=q, g=g, ck=ck):     # its own block: key j against queries i >= j
            dq, dk = carry
            dA_j = jnp.sum(jnp.where(cols == j, dA_d, 0.0), axis=1, keepdims=True)
            w = dA_j * _masked_exp(g - g_ref[pl.ds(j, 1), ck], rows >= j)     # dA_ij e^..
            return (dq + w * k_ref[pl.ds(j, 1), ck].astype(f32),
                    dk + jnp.where(rows == j, jnp.sum(w * q, axis=0, keepdims=True), 0.0))

        dq, dk = jax.lax.fori_loop(0, sub, key, (dq, dk), unroll=unroll)
        dG = q * dq - k * dk
        if dq_in_ref is not None:
            dq += dq_in_ref[:, ck].astype(f32)
            dk += dk_in_ref[:, ck].astype(f32)
            dG += dg_in_ref[:, ck]
        dq_ref[:, ck] = (dq * scale).astype(dq_ref.dtype)
        dk_ref[:, ck] = dk.astype(dk_ref.dtype)
        dg_ref[:, ck] = dG


def _sub(C):
    return SUB if C % SUB == 0 else C


def _call(cfg, kernel, ins, outs, btH, *, name):
    """pallas_call with one program per sub-chunk of c rows: ``ins`` are (array [B, T, H, X],
    "rows" | "chunk") pairs (the program's c rows, or its whole chunk of C); ``outs`` (X,
    dtype) pairs of per-token outputs, absent where the dtype is None. Grid (B, N C/c, H) on
    [B, T, H, X] ("triton"), (B, H, N C/c) on [B, H, T, X] ("tpu")."""
    B, T, H = btH
    C = cfg.chunk
    c, sq = _sub(C), pl.squeezed
    per = C // c
    present = [a is not None for a, _ in ins] + [dt is not None for _, dt in outs]
    ins = [i for i in ins if i[0] is not None]
    tpu = cfg.layout == "tpu"
    if tpu:
        from jax.experimental.pallas import tpu as pltpu
        grid = (B, H, T // c)
        spec = {"rows": lambda X: pl.BlockSpec((sq, sq, c, X), lambda b, h, i: (b, h, i, 0)),
                "chunk": lambda X: pl.BlockSpec((sq, sq, C, X),
                                                lambda b, h, i: (b, h, jax.lax.div(i, per), 0))}
        params = {"compiler_params": pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "parallel"))}
    else:
        grid = (B, T // c, H)
        spec = {"rows": lambda X: pl.BlockSpec((sq, c, sq, X), lambda b, i, h: (b, i, h, 0)),
                "chunk": lambda X: pl.BlockSpec((sq, C, sq, X),
                                                lambda b, i, h: (b, jax.lax.div(i, per), h, 0))}
        params = compiler_params(cfg, num_warps=cfg.chunk_warps)
    swap = (lambda a: jnp.swapaxes(a, 1, 2)) if tpu else (lambda a: a)  # noqa: E731
    shape = (lambda X: (B, H, T, X)) if tpu else (lambda X: (B, T, H, X))  # noqa: E731
    kernel = functools.partial(kernel, chunk=C, sub_axis=2 if tpu else 1, unroll=tpu)
    res = pl.pallas_call(
        with_absent(kernel, present),
        grid=grid, in_specs=[spec[kind](a.shape[-1]) for a, kind in ins],
        out_specs=[spec["rows"](X) for X, dt in outs if dt is not None],
        out_shape=[jax.ShapeDtypeStruct(shape(X), dt) for X, dt in outs if dt is not None],
        interpret=cfg.interpret, name=name, **params,
    )(*(swap(a) for a, _ in ins))
    res = iter(res)
    return tuple(None if dt is None else swap(next(res)) for _, dt in outs)


def _fwd(cfg, q, k, G):
    B, T, H, K = q.shape
    kernel = functools.partial(_fwd_kernel, blk=BLOCK, fp32_dots=cfg.fp32_dots)
    return _call(cfg, kernel, [(q, "rows"), (k, "rows"), (G, "rows"), (k, "chunk"),
                               (G, "chunk")], [(cfg.chunk, f32)], (B, T, H),
                 name="gla_intra_fwd")[0]


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def intra_scores(cfg, q, k, G):
    """A [B, T, H, C] fp32 (row t: its scores against the keys of its chunk, 0 after it) from q,
    k [B, T, H, K] (T a multiple of ``cfg.chunk``; the kernels' matmuls in q's dtype) and the
    chunk-local cumulative log decay G [B, T, H, K] fp32."""
    return _fwd(cfg, q, k, G)


def _vjp_fwd(cfg, q, k, G):
    return _fwd(cfg, q, k, G), (q, k, G)


def intra_grads(cfg, q, k, G, dA, dq=None, dk=None, dG=None, *, scale=1.0,
                out_dtypes=(f32, f32)):
    """dq, dk (in ``out_dtypes``) and dG (fp32) of ``intra_scores(cfg, q, k, G)`` at its
    cotangent dA [B, T, H, C] (read on and below the diagonal). Given the other paths' dq, dk,
    dG (all three or none), the kernel adds them, so the op's gradients leave it whole; dq is
    returned times ``scale`` (the gradient of the unscaled query when q was scaled)."""
    B, T, H, K = q.shape
    if (dq is None) != (dk is None) or (dq is None) != (dG is None):
        raise ValueError("intra_grads: give the other paths' dq, dk and dG all, or none")
    kernel = functools.partial(_bwd_kernel, blk=BLOCK, fp32_dots=cfg.fp32_dots,
                               scale=scale)
    dA = dA.astype(f32)
    return _call(cfg, kernel, [(q, "rows"), (k, "rows"), (G, "rows"), (q, "chunk"),
                               (k, "chunk"), (G, "chunk"), (dA, "rows"), (dA, "chunk"),
                               (dq, "rows"), (dk, "rows"), (dG, "rows")],
                 [(K, out_dtypes[0]), (K, out_dtypes[1]), (K, f32)], (B, T, H),
                 name="gla_intra_bwd")


def _grads(cfg, q, k, G, dA):
    dq, dk, dG = intra_grads(cfg, q, k, G, dA, out_dtypes=(q.dtype, k.dtype))
    return dq, dk, dG.astype(G.dtype)


def _vjp_bwd(cfg, res, dA):
    return _grads(cfg, *res, dA)


intra_scores.defvjp(_vjp_fwd, _vjp_bwd)
