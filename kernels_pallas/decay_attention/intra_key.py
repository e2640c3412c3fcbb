"""The intra-chunk scores of linear attention with a decay per key dimension (GLA, HGRN-2), as
Pallas kernels: ``intra_scores(cfg, q, k, G)`` and its backward ``intra_grads``.

Per chunk of C tokens, with G [C, K] the chunk-local cumulative log decay (non-increasing down
the chunk),

    A_ij = sum_k q_ik k_jk exp(G_ik - G_jk)   for j <= i, 0 above the diagonal.

The decay does not factor out of the sum, and neither factor e^{G_i}, e^{-G_j} alone is bounded.
Each program (one chunk of one head, ``common.chunk_call``) takes the query rows in sub-chunks
of c = 16 (``SUB``), with G_r the sub-chunk's first row, and two kernels share the work:

  factored   every key of the chunk up to the sub-chunk's end in one matmul over the keys'
             dimension (``intra_block`` columns at a time), (q_i e^{G_i - G_r}) (k_j e^{G_r -
             G_j})^T: every factor is <= 1 but for keys of the sub-chunk, where it is <= e^D,
             D the sub-chunk's decay range (G_first - G_last, per key); run when D <=
             ``FACTOR_RANGE`` (70) in every sub-chunk of the chunk, so that no factor overflows
             (bf16 has fp32's range; the products above the diagonal, up to e^D, are masked
             after the matmul) and a factor that underflows weighs at most e^{70 - 87} of the
             largest term. The reference row is the sub-chunk's first, the earliest row whose
             output it enters: a row's output is formed from its own and earlier positions
             only, so that what comes later does not even move its rounding;
  exact      the other chunks (a decay of more than e^-40 within 8 tokens), rerun over the
             factored kernel's output (aliased; the other programs return at once): keys before
             the sub-chunk against its first row (both factors <= 1), keys inside it through the
             weights e^{G_ik - G_jk} [c, c, BK] of BK = 16 key columns at a time (a
             ``fori_loop`` over K), every exponent <= 0. Which kernel a chunk takes reads its
             whole decay, so a strong decay late in a chunk moves the rounding (not the value)
             of the chunk's earlier outputs.

The backward, in the same two kernels and against the same reference rows, takes dA [C, C]
and returns dq (from a sub-chunk's rows of dA, against the keys up to its end) and dk (from its
columns of dA, against the queries from its start on), and finishes the op's gradients there
(``_tail``): the state path's dq, dk, dG added, dG = q dq - k dk (d exp(G_i - G_j) / dG_i = +,
/ dG_j = -), and dg, the sum of dG over each position and the later ones of its chunk (the
sub-chunks walked up, a running sum carried), so that no fp32 gradient goes back to memory
twice. ``bench/triton_regs.py --ops decay_key`` gives their registers and layout conversions
without a GPU. Both layouts of ``linear_scan.common`` ([B, T, H, X] with grid (B, N, H) for
Triton, [B, H, T, X] for Mosaic TPU) are tested interpreted and lower for their compilers
(``tests/training/test_export.py``); the Triton one runs on GPUs, the Mosaic one has not run on a TPU.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from kernels_pallas.linear_scan.common import chunk_call, col_blocks, dot, dot_nt, f32

SUB = 16  # query rows of a sub-chunk
BK = 16  # key columns at a time (the exact kernels' [c, c, BK] weights)
FACTOR_RANGE = 70.0  # log decay over a sub-chunk the factored kernels take


def _masked_exp(x, keep):
    """exp(x) where ``keep``, else 0 (masked before exp: the dropped entries may be > 0)."""
    return jnp.where(keep, jnp.exp(jnp.where(keep, x, 0.0)), 0.0)


def _iota(shape, axis):
    return jax.lax.broadcasted_iota(jnp.int32, shape, axis)


def _factored(g_ref, chunk, sub):
    """Whether in every sub-chunk the decay from its first row to its last (G_first - G_last,
    each key) is at most FACTOR_RANGE."""
    worst = None
    for r in range(0, chunk, sub):
        first, last = (g_ref[pl.ds(i, 1), :] for i in (r, r + sub - 1))
        d = jnp.max(first - last)
        worst = d if worst is None else jnp.maximum(worst, d)
    return worst <= FACTOR_RANGE


def _diag_weights(Gr):
    """e^{G_ik - G_jk} [c(i), c(j), BK] for j <= i within a sub-chunk, 0 above."""
    c, bk = Gr.shape
    lower = _iota((c, c, bk), 0) >= _iota((c, c, bk), 1)
    return _masked_exp(Gr[:, None, :] - Gr[None, :, :], lower)


# ---------------------------------------------------------------- factored kernels


def _fwd_factored(q_ref, k_ref, g_ref, a_ref, *, chunk, sub, blk, fp32_dots):
    dt = q_ref.dtype
    pos = _iota((chunk, 1), 0)

    @pl.when(_factored(g_ref, chunk, sub))
    def _():
        def body(s, _):
            r = pl.multiple_of(s * sub, sub)
            rows = pl.ds(r, sub)
            acc = jnp.zeros((sub, chunk), f32)
            for ck in col_blocks(q_ref.shape[-1], blk):
                gm = g_ref[pl.ds(r, 1), ck]  # the reference: the sub-chunk's first row
                qg = q_ref[rows, ck].astype(f32) * jnp.exp(g_ref[rows, ck] - gm)
                kg = k_ref[:, ck].astype(f32) * _masked_exp(gm - g_ref[:, ck], pos < r + sub)
                acc += dot_nt(qg.astype(dt), kg.astype(dt), fp32_dots)  # [c, C]
            keep = _iota((sub, chunk), 1) <= _iota((sub, chunk), 0) + r  # j <= i
            a_ref[rows, :] = jnp.where(keep, acc, 0.0).astype(a_ref.dtype)
            return 0

        jax.lax.fori_loop(0, chunk // sub, body, 0)


def _tail(rows, ck, dq_in, dk_in, dG_in, below, refs, scale):
    """The gradients of a block of rows (a sub-chunk) and key columns: the intra-chunk parts
    dq_in, dk_in, dG_in [c, ck] added to the state path's (dq_s, dk_s, dG_s), dq scaled, and
    the gradient of g, the sum of dG = dG_s + dG_in over the chunk's later rows: the sub-chunk's
    own by a triangular product, the later sub-chunks' (``below`` [1, ck], the sub-chunks are
    walked up) added. Returns ``below`` with this block's rows added."""
    dqs_ref, dks_ref, dgs_ref, dq_ref, dk_ref, dg_ref = refs
    c = dq_in.shape[0]
    dG = dgs_ref[rows, ck] + dG_in
    dq_ref[rows, ck] = ((dq_in + dqs_ref[rows, ck]) * scale).astype(dq_ref.dtype)
    dk_ref[rows, ck] = (dk_in + dks_ref[rows, ck]).astype(dk_ref.dtype)
    upper = (_iota((c, c), 0) <= _iota((c, c), 1)).astype(f32)  # U @ x: sums over s >= t
    dg_ref[rows, ck] = (dot(upper, dG, fp32_dots="ieee") + below).astype(dg_ref.dtype)
    return below + jnp.sum(dG, axis=0, keepdims=True)


def _bwd_factored(
    q_ref,
    k_ref,
    g_ref,
    da_ref,
    dqs_ref,
    dks_ref,
    dgs_ref,
    dq_ref,
    dk_ref,
    dg_ref,
    *,
    chunk,
    sub,
    blk,
    fp32_dots,
    scale,
):
    """dq = (dA kg) e^{G - G_r} and dk = (dA^T qg) e^{G_r - G} of each sub-chunk's rows, and
    dG = q dq - k dk formed as qg (dA kg) - kg (dA^T qg) from the same rounded factors qg, kg
    that went into the products: a pair (i, j) of the sub-chunk enters dG_i and dG_j as the same
    number, and cancels exactly in dg's sums, as it does in exact arithmetic (rounded apart, it
    would leave an error that a strong decay, which makes dg small, magnifies)."""
    dt = q_ref.dtype
    pos = _iota((chunk, 1), 0)
    n = chunk // sub
    cks = col_blocks(q_ref.shape[-1], blk)
    refs = (dqs_ref, dks_ref, dgs_ref, dq_ref, dk_ref, dg_ref)

    @pl.when(_factored(g_ref, chunk, sub))
    def _():
        def body(i, below):
            r = pl.multiple_of((n - 1 - i) * sub, sub)  # the last sub-chunk first
            rows = pl.ds(r, sub)
            dA_rows = jnp.where(
                _iota((sub, chunk), 1) <= _iota((sub, chunk), 0) + r,
                da_ref[rows, :].astype(f32),
                0.0,
            ).astype(dt)  # [c, C]
            dA_cols = jnp.where(
                _iota((chunk, sub), 0) >= _iota((chunk, sub), 1) + r,
                da_ref[:, rows].astype(f32),
                0.0,
            ).astype(dt)  # [C, c]
            out = []
            for ck, bl in zip(cks, below):
                Gr, gm = g_ref[rows, ck], g_ref[pl.ds(r, 1), ck]
                kg = k_ref[:, ck].astype(f32) * _masked_exp(gm - g_ref[:, ck], pos < r + sub)
                qg = q_ref[:, ck].astype(f32) * _masked_exp(g_ref[:, ck] - gm, pos >= r)
                dq = dot(dA_rows, kg.astype(dt), fp32_dots=fp32_dots)  # [c, ck]
                dk = dot(dA_cols, qg.astype(dt), trans_a=True, fp32_dots=fp32_dots)
                up, down = jnp.exp(Gr - gm), jnp.exp(gm - Gr)
                qg_r = (q_ref[rows, ck].astype(f32) * up).astype(dt).astype(f32)
                kg_r = (k_ref[rows, ck].astype(f32) * down).astype(dt).astype(f32)
                out.append(
                    _tail(rows, ck, dq * up, dk * down, qg_r * dq - kg_r * dk, bl, refs, scale)
                )
            return tuple(out)

        jax.lax.fori_loop(0, n, body, tuple(jnp.zeros((1, ck.size), f32) for ck in cks))


# ---------------------------------------------------------------- exact kernels


def _keep_factored(factored, pairs):
    """On TPU an output block goes back to memory whether written or not: the programs of
    factored chunks copy the aliased input's block through (``pairs``: (input, output) refs).
    On GPU the refs are the memory itself and those programs do nothing."""

    @pl.when(factored)
    def _():
        for src, dst in pairs:
            dst[...] = src[...]


def _fwd_exact(q_ref, k_ref, g_ref, a_in, a_ref, *, chunk, sub, bk, fp32_dots, copy):
    dt = q_ref.dtype
    K = q_ref.shape[-1]
    pos = _iota((chunk, bk), 0)
    cols, rows_c = _iota((sub, chunk), 1), _iota((sub, chunk), 0)
    factored = _factored(g_ref, chunk, sub)
    if copy:
        _keep_factored(factored, [(a_in, a_ref)])

    @pl.when(jnp.logical_not(factored))
    def _():
        for r in range(0, chunk, sub):
            rows = slice(r, r + sub)

            def body(i, carry, r=r, rows=rows):
                acc, diag = carry
                ks = pl.ds(pl.multiple_of(i * bk, bk), bk)
                qr, kr, Gr = (
                    q_ref[rows, ks].astype(f32),
                    k_ref[rows, ks].astype(f32),
                    g_ref[rows, ks],
                )
                if r:  # keys before the sub-chunk: G_i <= G_r <= G_j
                    g0 = g_ref[pl.ds(r, 1), ks]
                    kb = k_ref[:, ks].astype(f32) * _masked_exp(g0 - g_ref[:, ks], pos < r)
                    acc = acc + dot_nt((qr * jnp.exp(Gr - g0)).astype(dt), kb.astype(dt), fp32_dots)
                diag = diag + jnp.sum(qr[:, None, :] * kr[None, :, :] * _diag_weights(Gr), axis=2)
                return acc, diag

            acc, diag = jax.lax.fori_loop(
                0, K // bk, body, (jnp.zeros((sub, chunk), f32), jnp.zeros((sub, sub), f32))
            )
            place = (cols == rows_c + r).astype(f32)  # [c, c] -> columns r.. of [c, C]
            acc = acc + dot(diag, place, fp32_dots="ieee")
            a_ref[rows, :] = acc.astype(a_ref.dtype)


def _bwd_exact(
    q_ref,
    k_ref,
    g_ref,
    da_ref,
    dqs_ref,
    dks_ref,
    dgs_ref,
    dq_in,
    dk_in,
    dg_in,
    dq_ref,
    dk_ref,
    dg_ref,
    *,
    chunk,
    sub,
    bk,
    fp32_dots,
    scale,
    copy,
):
    """BK key columns at a time, and in them each sub-chunk from the last up: its rows of dq
    (from its rows of dA) and of dk (from its columns of dA), the earlier keys (dq) or later
    queries (dk) by one matmul, its own block as the forward's; then ``_tail``."""
    dt = q_ref.dtype
    K = q_ref.shape[-1]
    pos = _iota((chunk, bk), 0)
    factored = _factored(g_ref, chunk, sub)
    refs = (dqs_ref, dks_ref, dgs_ref, dq_ref, dk_ref, dg_ref)
    if copy:
        _keep_factored(factored, [(dq_in, dq_ref), (dk_in, dk_ref), (dg_in, dg_ref)])

    @pl.when(jnp.logical_not(factored))
    def _():
        def body(i, _):
            ks = pl.ds(pl.multiple_of(i * bk, bk), bk)
            below = jnp.zeros((1, bk), f32)
            for r in reversed(range(0, chunk, sub)):
                rows = slice(r, r + sub)
                dA_diag = da_ref[rows, pl.ds(r, sub)].astype(f32)  # [c, c]
                qr, kr, Gr = (
                    q_ref[rows, ks].astype(f32),
                    k_ref[rows, ks].astype(f32),
                    g_ref[rows, ks],
                )
                w = _diag_weights(Gr)
                dq = jnp.sum(dA_diag[:, :, None] * kr[None, :, :] * w, axis=1)
                dk = jnp.sum(dA_diag[:, :, None] * qr[:, None, :] * w, axis=0)
                if r:  # dq from the keys before: as the forward's product
                    g0 = g_ref[pl.ds(r, 1), ks]
                    kb = k_ref[:, ks].astype(f32) * _masked_exp(g0 - g_ref[:, ks], pos < r)
                    dAb = jnp.where(
                        _iota((sub, chunk), 1) < r, da_ref[rows, :].astype(f32), 0.0
                    ).astype(dt)
                    dq = dq + dot(dAb, kb.astype(dt), fp32_dots=fp32_dots) * jnp.exp(Gr - g0)
                if r + sub < chunk:  # dk from the queries after, against the sub-chunk's last G
                    gl = g_ref[pl.ds(r + sub - 1, 1), ks]
                    qa = q_ref[:, ks].astype(f32) * _masked_exp(g_ref[:, ks] - gl, pos >= r + sub)
                    dAa = jnp.where(
                        _iota((chunk, sub), 0) >= r + sub, da_ref[:, pl.ds(r, sub)].astype(f32), 0.0
                    ).astype(dt)
                    dk = dk + dot(dAa, qa.astype(dt), trans_a=True, fp32_dots=fp32_dots) * jnp.exp(
                        gl - Gr
                    )
                below = _tail(rows, ks, dq, dk, qr * dq - kr * dk, below, refs, scale)
            return 0

        jax.lax.fori_loop(0, K // bk, body, 0)


# ---------------------------------------------------------------- launchers


def _sub(C):
    return SUB if C % SUB == 0 else C


def _bk(K):
    return BK if K % BK == 0 else K


def intra_scores(cfg, q, k, G):
    """A [B, T, H, C] in q's dtype (row t: its scores against the keys of its chunk, 0 after
    it) from q, k [B, T, H, K] (T a multiple of ``cfg.chunk``; the kernels' matmuls in q's
    dtype) and the chunk-local cumulative log decay G [B, T, H, K] fp32. Its gradients:
    ``intra_grads``."""
    B, T, H, K = q.shape
    C = cfg.chunk
    kw = dict(chunk=C, sub=_sub(C), fp32_dots=cfg.fp32_dots)
    ins, out = [(q, K), (k, K), (G, K)], [(C, q.dtype)]
    (a,) = chunk_call(
        cfg,
        functools.partial(_fwd_factored, blk=cfg.intra_block, **kw),
        ins,
        out,
        (B, T, H),
        name="gla_intra_fwd",
    )
    exact = functools.partial(_fwd_exact, bk=_bk(K), copy=cfg.layout == "tpu", **kw)
    return chunk_call(
        cfg, exact, ins + [(a, C)], out, (B, T, H), name="gla_intra_fwd_exact", aliases={3: 0}
    )[0]


def intra_grads(cfg, q, k, G, dA, dq_s, dk_s, dG_s, *, scale, dtypes):
    """The gradients of gated linear attention with a decay per key at the intra-chunk scores'
    cotangent dA [B, T, H, C] (read on and below the diagonal), given those through the state
    (dq_s, dk_s, dG_s [B, T, H, K] fp32): (dq * scale, dk, dg) in ``dtypes``, dq and dk the
    sums of both paths' and dg the gradient of the log decay g (the sum of dG over each
    position and the later ones of its chunk, G being g's chunk-local cumulative sum)."""
    B, T, H, K = q.shape
    C = cfg.chunk
    kw = dict(chunk=C, sub=_sub(C), fp32_dots=cfg.fp32_dots, scale=scale)
    ins = [(q, K), (k, K), (G, K), (dA, C), (dq_s, K), (dk_s, K), (dG_s, K)]
    outs = [(K, dt) for dt in dtypes]
    dq, dk, dg = chunk_call(
        cfg,
        functools.partial(_bwd_factored, blk=cfg.intra_block, **kw),
        ins,
        outs,
        (B, T, H),
        name="gla_intra_bwd",
    )
    exact = functools.partial(_bwd_exact, bk=_bk(K), copy=cfg.layout == "tpu", **kw)
    return chunk_call(
        cfg,
        exact,
        ins + [(dq, K), (dk, K), (dg, K)],
        outs,
        (B, T, H),
        name="gla_intra_bwd_exact",
        aliases={7: 0, 8: 1, 9: 2},
    )
