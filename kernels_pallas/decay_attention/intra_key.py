"""The intra-chunk scores of linear attention with a decay per key dimension (GLA, HGRN-2), as
Pallas kernels with their own backward: ``intra_scores(cfg, q, k, G)``.

Per chunk of C tokens, with G [C, K] the chunk-local cumulative log decay (non-increasing down
the chunk),

    A_ij = sum_k q_ik k_jk exp(G_ik - G_jk)   for j <= i, 0 above the diagonal.

The decay does not factor out of the sum, and neither factor e^{G_i}, e^{-G_j} alone is bounded,
so each program (one chunk of one head, ``common.chunk_call``) takes the query rows in
sub-chunks of c = 16 (``SUB``) and keeps every exponent <= 0:

  keys before the sub-chunk    one matmul, (q_i e^{G_i - G_r}) (k_j e^{G_r - G_j})^T, with G_r
                               the sub-chunk's first row (G_i <= G_r <= G_j);
  keys inside it               the weights e^{G_ik - G_jk} [c, c, BK] of BK = 16 key columns at
                               a time (a ``fori_loop`` over K: registers, never memory), summed
                               over k, placed at the sub-chunk's columns by an exact fp32 product.

The backward takes dA [C, C] and returns dq (from a sub-chunk's rows of dA: the earlier keys by
one matmul, its own block as the forward's) and dk (from its columns of dA: the later queries,
against the sub-chunk's last row of G); dG = q * dq - k * dk follows outside the kernel
(d exp(G_i - G_j) / dG_i = +, / dG_j = -). ``bench/triton_regs.py --ops decay_key`` gives their
registers and layout conversions without a GPU. Both layouts of ``linear_scan.common`` ([B, T,
H, X] with grid (B, N, H) for Triton, [B, H, T, X] for Mosaic TPU) are tested interpreted and
lower for their compilers (``tests/test_export.py``); the Triton one runs on GPUs, the Mosaic
one has not run on a TPU.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from kernels_pallas.linear_scan.common import chunk_call, dot, dot_nt, f32

SUB = 16                    # query rows of a sub-chunk
BK = 16                     # key columns at a time (the [c, c, BK] weights of a sub-chunk)


def _masked_exp(x, keep):
    """exp(x) where ``keep``, else 0 (masked before exp: the dropped entries may be > 0)."""
    return jnp.where(keep, jnp.exp(jnp.where(keep, x, 0.0)), 0.0)


def _iota(shape, axis):
    return jax.lax.broadcasted_iota(jnp.int32, shape, axis)


def _diag_weights(Gr):
    """e^{G_ik - G_jk} [c(i), c(j), BK] for j <= i within a sub-chunk, 0 above."""
    c, bk = Gr.shape
    lower = _iota((c, c, bk), 0) >= _iota((c, c, bk), 1)
    return _masked_exp(Gr[:, None, :] - Gr[None, :, :], lower)


def _fwd_kernel(q_ref, k_ref, g_ref, a_ref, *, chunk, sub, bk, fp32_dots):
    dt = q_ref.dtype
    K = q_ref.shape[-1]
    pos = _iota((chunk, bk), 0)
    cols, rows_c = _iota((sub, chunk), 1), _iota((sub, chunk), 0)
    for r in range(0, chunk, sub):
        rows = slice(r, r + sub)

        def body(i, carry, r=r, rows=rows):
            acc, diag = carry
            ks = pl.ds(pl.multiple_of(i * bk, bk), bk)
            qr, kr, Gr = (q_ref[rows, ks].astype(f32), k_ref[rows, ks].astype(f32),
                          g_ref[rows, ks])
            if r:                    # keys before the sub-chunk: G_i <= G_r <= G_j
                g0 = g_ref[pl.ds(r, 1), ks]
                kb = k_ref[:, ks].astype(f32) * _masked_exp(g0 - g_ref[:, ks], pos < r)
                acc = acc + dot_nt((qr * jnp.exp(Gr - g0)).astype(dt), kb.astype(dt),
                                   fp32_dots)
            diag = diag + jnp.sum(qr[:, None, :] * kr[None, :, :] * _diag_weights(Gr), axis=2)
            return acc, diag

        acc, diag = jax.lax.fori_loop(0, K // bk, body, (jnp.zeros((sub, chunk), f32),
                                                          jnp.zeros((sub, sub), f32)))
        place = (cols == rows_c + r).astype(f32)  # [c, c] -> columns r.. of [c, C], exactly
        acc = acc + dot(diag, place, fp32_dots="ieee")
        a_ref[rows, :] = acc.astype(a_ref.dtype)


def _bwd_kernel(q_ref, k_ref, g_ref, da_ref, dq_ref, dk_ref, *, chunk, sub, bk, fp32_dots):
    """A sub-chunk's rows of dq (from its rows of dA) and of dk (from its columns of dA): the
    earlier keys (dq) or later queries (dk) by one matmul, its own block as the forward's."""
    dt = q_ref.dtype
    K = q_ref.shape[-1]
    pos = _iota((chunk, bk), 0)
    for r in range(0, chunk, sub):
        rows = slice(r, r + sub)
        dA_rows = da_ref[rows, :].astype(f32)                          # [c, C]
        dA_cols = da_ref[:, pl.ds(r, sub)].astype(f32)                 # [C, c]
        dA_diag = da_ref[rows, pl.ds(r, sub)].astype(f32)              # [c, c]

        def body(i, _, r=r, rows=rows, dA_rows=dA_rows, dA_cols=dA_cols, dA_diag=dA_diag):
            ks = pl.ds(pl.multiple_of(i * bk, bk), bk)
            qr, kr, Gr = (q_ref[rows, ks].astype(f32), k_ref[rows, ks].astype(f32),
                          g_ref[rows, ks])
            w = _diag_weights(Gr)
            dq = jnp.sum(dA_diag[:, :, None] * kr[None, :, :] * w, axis=1)
            dk = jnp.sum(dA_diag[:, :, None] * qr[:, None, :] * w, axis=0)
            if r:                    # dq from the keys before: as the forward's product
                g0 = g_ref[pl.ds(r, 1), ks]
                kb = k_ref[:, ks].astype(f32) * _masked_exp(g0 - g_ref[:, ks], pos < r)
                dAb = jnp.where(_iota((sub, chunk), 1) < r, dA_rows, 0.0).astype(dt)
                dq = dq + dot(dAb, kb.astype(dt), fp32_dots=fp32_dots) * jnp.exp(Gr - g0)
            if r + sub < chunk:      # dk from the queries after, against the sub-chunk's last G
                gl = g_ref[pl.ds(r + sub - 1, 1), ks]
                qa = q_ref[:, ks].astype(f32) * _masked_exp(g_ref[:, ks] - gl, pos >= r + sub)
                dAa = jnp.where(_iota((chunk, sub), 0) >= r + sub, dA_cols, 0.0).astype(dt)
                dk = dk + dot(dAa, qa.astype(dt), trans_a=True,
                              fp32_dots=fp32_dots) * jnp.exp(gl - Gr)
            dq_ref[rows, ks] = dq.astype(dq_ref.dtype)
            dk_ref[rows, ks] = dk.astype(dk_ref.dtype)
            return 0

        jax.lax.fori_loop(0, K // bk, body, 0)


def _sub(C):
    return SUB if C % SUB == 0 else C


def _bk(K):
    return BK if K % BK == 0 else K


def _fwd(cfg, q, k, G):
    B, T, H, K = q.shape
    C = cfg.chunk
    kernel = functools.partial(_fwd_kernel, chunk=C, sub=_sub(C), bk=_bk(K),
                               fp32_dots=cfg.fp32_dots)
    return chunk_call(cfg, kernel, [(q, K), (k, K), (G, K)], [(C, f32)], (B, T, H),
                      name="gla_intra_fwd")[0]


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def intra_scores(cfg, q, k, G):
    """A [B, T, H, C] fp32 (row t: its scores against the keys of its chunk, 0 after it) from q,
    k [B, T, H, K] (T a multiple of ``cfg.chunk``; the kernels' matmuls in q's dtype) and the
    chunk-local cumulative log decay G [B, T, H, K] fp32."""
    return _fwd(cfg, q, k, G)


def _vjp_fwd(cfg, q, k, G):
    return _fwd(cfg, q, k, G), (q, k, G)


def intra_grads(cfg, q, k, G, dA):
    """dq, dk, dG (fp32) of ``intra_scores(cfg, q, k, G)`` at its cotangent dA [B, T, H, C]
    (read on and below the diagonal)."""
    B, T, H, K = q.shape
    C = cfg.chunk
    kernel = functools.partial(_bwd_kernel, chunk=C, sub=_sub(C), bk=_bk(K),
                               fp32_dots=cfg.fp32_dots)
    dq, dk = chunk_call(cfg, kernel, [(q, K), (k, K), (G, K), (dA.astype(f32), C)],
                        [(K, f32), (K, f32)], (B, T, H), name="gla_intra_bwd")
    return dq, dk, q.astype(f32) * dq - k.astype(f32) * dk


def _grads(cfg, q, k, G, dA):
    dq, dk, dG = intra_grads(cfg, q, k, G, dA)
    return dq.astype(q.dtype), dk.astype(k.dtype), dG.astype(G.dtype)


def _vjp_bwd(cfg, res, dA):
    return _grads(cfg, *res, dA)


intra_scores.defvjp(_vjp_fwd, _vjp_bwd)
