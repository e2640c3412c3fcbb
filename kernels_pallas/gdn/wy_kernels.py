"""The chunk-parallel part of chunked Gated DeltaNet as Pallas kernels: WY/UT form, fwd and bwd.

One program per (batch, chunk, head). With chunk-local cumulative log gates G [C], the scaled
queries q and keys k [C, K], values v [C, V] and beta [C] of one chunk (all as columns [C, 1]
where per token), the forward kernel forms

    A   = diag(beta) (k k^T o D)          D_ij = e^{G_i - G_j} for j < i, else 0
    X   = (I + A)^-1                       unit lower triangular
    w   = X diag(beta e^G) k,   u = X diag(beta) v
    QK  = (q k^T) o Dc                     Dc_ij = e^{G_i - G_j} for j <= i, else 0

X is built by ``_inverse_kernel`` from 16 x 16 diagonal blocks inverted row by row
(row r = e_r - A_r X) and exact block forward substitution below the diagonal
(X_ij = -X_ii sum_{j<=l<i} A_il X_lj): every entry is an elimination, no power series, so no
cancellation whatever the keys. X is saved for the backward pass in k's dtype (fla stores its
inverse so too); ``_apply_kernel`` forms w, u and QK from it (in the forward, and again in the
backward).

The backward kernel takes the cotangents dw, du (with the state path's dk and dG, to which it
adds) and returns dk, dv, dbeta and dG (the gradient with respect to the cumulative gates; the
caller turns it into dg); the scores' part, through dQK, is the state-path kernel's
(``linear_scan.scan.state_grads``):

    dX  = dw kb^T + du vb^T,   dkb = X^T dw,   dvb = X^T du       (kb = beta e^G k, vb = beta v)
    dA  = -(X^T dX X^T) o strict-lower,   E = dA o D
    dk  = beta e^G dkb + diag(beta) E k + (diag(beta) E)^T k,   dv = beta dvb
    dbeta = rowsum(dkb o e^G k) + rowsum(dvb o v) + rowsum(E o k k^T)
    dG  = rowsum(dkb o kb) + rowsum(M) - colsum(M),   M = dA o A
Masks are applied to the exponent (before ``exp``), so no masked entry can overflow. Wide
operands are walked in 64-column blocks so that few [C, 64] fp32 tiles are live at once. The two
fp32 products X^T dX X^T run in TF32 on GPU by default (``GDNSettings.fp32_dots``): faster than
IEEE products at unchanged bf16 error (docs/benchmarks.md).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from kernels_pallas.gdn.wy_apply_mosaic import wy_apply_mosaic
from kernels_pallas.linear_scan.chunk_math import colsum, times
from kernels_pallas.linear_scan.common import (
    chunk_call,
    col_blocks,
    column,
    dot,
    dot_nt,
    f32,
    ref_all,
)

_NEG = -1e30


def _decay(Gi, Gj, mask, shape=None, scale=1.0):
    """scale e^{G_i - G_j} where ``mask`` ("strict": j < i, "causal": j <= i) keeps it, else 0;
    mask None keeps all (a block wholly below the diagonal). Gi [n, 1], Gj [m, 1]. Without a
    decay (Gi None) the mask alone as ``scale`` and 0s of ``shape`` (None where there is no mask
    and no scale)."""
    if Gi is None:
        if mask is None:
            return None if scale == 1.0 else jnp.full(shape, scale, f32)
        r = jax.lax.broadcasted_iota(jnp.int32, shape, 0)
        c = jax.lax.broadcasted_iota(jnp.int32, shape, 1)
        return jnp.where(r > c if mask == "strict" else r >= c, scale, 0.0)
    diff = Gi - Gj.T
    if mask is not None:
        r = jax.lax.broadcasted_iota(jnp.int32, diff.shape, 0)
        c = jax.lax.broadcasted_iota(jnp.int32, diff.shape, 1)
        diff = jnp.where(r > c if mask == "strict" else r >= c, diff, _NEG)
    return jnp.exp(diff) if scale == 1.0 else scale * jnp.exp(diff)


def _invert_diag_block(A):
    """(I + A)^-1 of one strictly lower [s, s] block, row by row."""
    s = A.shape[0]
    rows = jax.lax.broadcasted_iota(jnp.int32, (s, s), 0)
    cols = jax.lax.broadcasted_iota(jnp.int32, (s, s), 1)
    X = jnp.where(rows == cols, 1.0, 0.0).astype(f32)
    AT = A.T
    for r in range(1, s):
        a_col = jnp.sum(jnp.where(cols == r, AT, 0.0), axis=1, keepdims=True)  # A[r, :]^T
        new = jnp.sum(a_col * X, axis=0, keepdims=True)  # A[r, :] X
        X = X - jnp.where(rows == r, new, 0.0)
    return X


def _inverse_kernel(k_ref, b_ref, g_ref, x_ref, *, sub):
    """X = (I + A)^-1 of one chunk, in sub x sub blocks (upper blocks written as zeros)."""
    C = k_ref.shape[0]
    m = C // sub
    rs = [pl.ds(i * sub, sub) for i in range(m)]
    A = {}
    g = (lambda r: None) if g_ref is None else (lambda r: g_ref[r, :])
    for i in range(m):
        Gi, bi, ki = g(rs[i]), b_ref[rs[i], :].astype(f32), k_ref[rs[i], :]
        for j in range(i + 1):
            A[i, j] = times(
                bi * dot_nt(ki, k_ref[rs[j], :]),
                _decay(Gi, g(rs[j]), "strict" if i == j else None, (sub, sub)),
            )
    X = {(i, i): _invert_diag_block(A[i, i]) for i in range(m)}
    for i in range(1, m):
        for j in range(i):
            acc = dot(A[i, j], X[j, j])
            for l in range(j + 1, i):
                acc = acc + dot(A[i, l], X[l, j])
            X[i, j] = -dot(X[i, i], acc)
    for i in range(m):
        for j in range(m):
            x_ref[rs[i], rs[j]] = (X[i, j] if j <= i else jnp.zeros((sub, sub), f32)).astype(
                x_ref.dtype
            )


def _apply_kernel(q_ref, k_ref, v_ref, b_ref, g_ref, x_ref, w_ref, u_ref, qk_ref, *, blk, q_scale):
    """w = X (beta e^G k), u = X (beta v), QK = (q k^T) o Dc for one chunk, given X; the K
    and V columns in blocks of ``blk`` so that few wide fp32 tiles are live at once; QK times
    ``q_scale`` (q unscaled)."""
    C, K = k_ref.shape
    V = v_ref.shape[-1]
    cd = k_ref.dtype
    G, beta = ref_all(g_ref), b_ref[...].astype(f32)
    Xc = x_ref[...].astype(cd)
    scale_k = beta if G is None else beta * jnp.exp(G)
    qk = jnp.zeros((C, C), f32)
    for c in col_blocks(K, blk):
        k = k_ref[:, c]
        qk += dot_nt(q_ref[:, c], k)
        w_ref[:, c] = dot(Xc, (scale_k * k.astype(f32)).astype(cd)).astype(w_ref.dtype)
    qk_ref[...] = (qk * _decay(G, G, "causal", (C, C), q_scale)).astype(qk_ref.dtype)
    for c in col_blocks(V, blk):
        u_ref[:, c] = dot(Xc, (beta * v_ref[:, c].astype(f32)).astype(cd)).astype(u_ref.dtype)


def _wy_bwd_kernel(
    k_ref,
    v_ref,
    b_ref,
    g_ref,
    x_ref,
    dw_ref,
    du_ref,
    dk_in_ref,
    dg_in_ref,
    dk_ref,
    dv_ref,
    db_ref,
    dg_ref,
    *,
    blk,
    fp32_dots,
):
    """Ordered so that few [C, C] fp32 tiles are live at once (register pressure is what
    bounds this kernel): dX dies into E, k k^T into E o kk. Without a decay (g_ref, dg_in_ref
    and dg_ref None) no exponentials and no dG."""
    C, K = k_ref.shape
    V = v_ref.shape[-1]
    cd = k_ref.dtype
    decay = g_ref is not None
    G, beta = ref_all(g_ref), b_ref[...].astype(f32)
    eG = jnp.exp(G) if decay else None
    bk = times(beta, eG)  # kb = bk k
    dX = jnp.zeros((C, C), f32)  # dw kb^T + du vb^T
    for c in col_blocks(K, blk):
        dX += dot_nt(dw_ref[:, c], (bk * k_ref[:, c].astype(f32)).astype(cd))
    for c in col_blocks(V, blk):
        dX += dot_nt(du_ref[:, c], (beta * v_ref[:, c].astype(f32)).astype(cd))
    X = x_ref[...].astype(f32)
    XtdX = dot(X, dX, trans_a=True, fp32_dots=fp32_dots)
    E = -dot_nt(XtdX, X, fp32_dots=fp32_dots) * _decay(G, G, "strict", (C, C))  # dA o D
    Xc = X.astype(cd)
    kk = jnp.zeros((C, C), f32)
    for c in col_blocks(K, blk):
        k = k_ref[:, c]
        kk += dot_nt(k, k)
    Ekk = E * kk
    db = jnp.sum(Ekk, axis=1, keepdims=True)
    if decay:
        PM = beta * Ekk  # dA o A
        dG = dg_in_ref[...] + jnp.sum(PM, axis=1, keepdims=True) - colsum(PM)
    bE = beta * E
    Es = (bE + bE.T).astype(cd)  # (diag(beta) E) k + its transpose
    for c in col_blocks(K, blk):
        k, dw = k_ref[:, c], dw_ref[:, c]
        kf = k.astype(f32)
        dkb = dot(Xc, dw, trans_a=True)
        dk_ref[:, c] = (dk_in_ref[:, c] + bk * dkb + dot(Es, k)).astype(dk_ref.dtype)
        db += jnp.sum(dkb * times(kf, eG), axis=1, keepdims=True)
        if decay:
            dG += jnp.sum(dkb * bk * kf, axis=1, keepdims=True)
    for c in col_blocks(V, blk):
        dvb = dot(Xc, du_ref[:, c], trans_a=True)
        dv_ref[:, c] = (beta * dvb).astype(dv_ref.dtype)
        db += jnp.sum(dvb * v_ref[:, c].astype(f32), axis=1, keepdims=True)
    db_ref[...] = db
    if decay:
        dg_ref[...] = dG


# ---------------------------------------------------------------- launchers


def wy_forward(cfg, q, k, v, beta, G, X=None, *, sub=16, q_scale=1.0):
    """w [B,T,H,K], u [B,T,H,V], QK [B,T,H,C] and X [B,T,H,C] (computed unless given), all in
    k's dtype (X is rounded to it where the products use it, so storing it so loses nothing in
    the forward; the backward's X^T dX X^T reads it back, as fla's does).
    QK = q_scale (q k^T) o Dc: q is the scaled query with q_scale 1, or the query with its
    scale; beta and G [B, T, H] (G None: no decay)."""
    B, T, H, K = k.shape
    V, C = v.shape[-1], cfg.chunk
    cd = k.dtype
    b1, G1 = beta[..., None], column(G)
    if X is None:
        (X,) = chunk_call(
            cfg,
            functools.partial(_inverse_kernel, sub=math.gcd(sub, C)),
            [(k, K), (b1, 1), (G1, 1)],
            [(C, cd)],
            (B, T, H),
            name="gdn_wy_inverse",
            num_warps=cfg.inverse_warps,
        )
    if cfg.wy_apply == "mosaic":
        w, u, qk = wy_apply_mosaic(
            q, k, v, beta, G, X, q_scale=q_scale, interpret=cfg.interpret is not False
        )
        return w, u, qk, X
    w, u, qk = chunk_call(
        cfg,
        functools.partial(_apply_kernel, blk=cfg.chunk_block, q_scale=q_scale),
        [(q, K), (k, K), (v, V), (b1, 1), (G1, 1), (X, C)],
        [(K, cd), (V, cd), (C, cd)],
        (B, T, H),
        name="gdn_wy_apply",
    )
    return w, u, qk, X


def wy_backward(cfg, k, v, beta, G, X, dw, du, dk, dG, *, out_dtypes=(f32, f32)):
    """Adds the WY-path gradients to dk and dG (the state path's and the scores', from
    ``linear_scan.state_grads``) and returns (dk, dv) [B,T,H,X] in ``out_dtypes``, (dbeta, dG)
    fp32 [B, T, H] (G and dG None, no decay: dG None). Writing the final dtypes here spares a
    pass of XLA casts."""
    B, T, H, K = k.shape
    V, C = v.shape[-1], cfg.chunk
    # TF32 is a GPU (Triton) notion: elsewhere the fp32 products stay at full precision.
    fp32_dots = cfg.fp32_dots if cfg.layout == "triton" else "ieee"
    decay = G is not None
    dk, dv, db, dG = chunk_call(
        cfg,
        functools.partial(_wy_bwd_kernel, blk=cfg.chunk_block, fp32_dots=fp32_dots),
        [
            (k, K),
            (v, V),
            (beta[..., None], 1),
            (column(G), 1),
            (X, C),
            (dw, K),
            (du, V),
            (dk, K),
            (column(dG), 1),
        ],
        [(K, out_dtypes[0]), (V, out_dtypes[1]), (1, f32), (1, f32 if decay else None)],
        (B, T, H),
        name="gdn_wy_bwd",
    )
    return dk, dv, db[..., 0], (dG[..., 0] if decay else None)
