"""The chunk-parallel part of chunked Gated DeltaNet as Pallas kernels: WY/UT form, fwd and bwd.

One program per (batch, chunk, head). With chunk-local cumulative log gates G [C], the scaled
queries q and keys k [C, K], values v [C, V] and beta [C] of one chunk (all as columns [C, 1]
where per token), the forward kernel forms

    A   = diag(beta) (k k^T o D)          D_ij = e^{G_i - G_j} for j < i, else 0
    X   = (I + A)^-1                       unit lower triangular
    w   = X diag(beta e^G) k,   u = X diag(beta) v
    QK  = (q k^T) o Dc                     Dc_ij = e^{G_i - G_j} for j <= i, else 0

X is built from sub x sub diagonal blocks inverted row by row (row r = e_r - A_r X) and exact
block forward substitution below the diagonal (X_ij = -X_ii sum_{j<=l<i} A_il X_lj): every
entry is an elimination, no power series, so no cancellation whatever the keys. The kernel
saves X (fp32) for the backward pass; given X it recomputes w, u and QK only.

The backward kernel takes the cotangents dw, du, dQK and returns dq, dk, dv, dbeta and dG
(the gradient with respect to the cumulative gates; the caller turns it into dg):

    dX  = dw kb^T + du vb^T,   dkb = X^T dw,   dvb = X^T du       (kb = beta e^G k, vb = beta v)
    dA  = -(X^T dX X^T) o strict-lower,   E = dA o D
    dk  = beta e^G dkb + diag(beta) E k + (diag(beta) E)^T k + F^T q,   F = dQK o Dc
    dq  = F k,   dv = beta dvb
    dbeta = rowsum(dkb o e^G k) + rowsum(dvb o v) + rowsum(E o k k^T)
    dG  = rowsum(dkb o kb) + rowsum(M) - colsum(M) + rowsum(P) - colsum(P),
          M = dA o A,   P = dQK o QK
Masks are applied to the exponent (before ``exp``), so no masked entry can overflow.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from kernels_pallas.gdn.scan_kernels import _dot, _dot_nt, _params

f32 = jnp.float32
_NEG = -1e30


def _decay(Gi, Gj, mask):
    """e^{G_i - G_j} where ``mask`` ("strict": j < i, "causal": j <= i) keeps it, else 0;
    mask None keeps all (a block wholly below the diagonal). Gi [n, 1], Gj [m, 1]."""
    diff = Gi - Gj.T
    if mask is None:
        return jnp.exp(diff)
    r = jax.lax.broadcasted_iota(jnp.int32, diff.shape, 0)
    c = jax.lax.broadcasted_iota(jnp.int32, diff.shape, 1)
    return jnp.exp(jnp.where(r > c if mask == "strict" else r >= c, diff, _NEG))


def _invert_diag_block(A):
    """(I + A)^-1 of one strictly lower [s, s] block, row by row."""
    s = A.shape[0]
    rows = jax.lax.broadcasted_iota(jnp.int32, (s, s), 0)
    cols = jax.lax.broadcasted_iota(jnp.int32, (s, s), 1)
    X = jnp.where(rows == cols, 1.0, 0.0).astype(f32)
    AT = A.T
    for r in range(1, s):
        a_col = jnp.sum(jnp.where(cols == r, AT, 0.0), axis=1, keepdims=True)   # A[r, :]^T
        new = jnp.sum(a_col * X, axis=0, keepdims=True)                         # A[r, :] X
        X = X - jnp.where(rows == r, new, 0.0)
    return X


def _wy_fwd_kernel(q_ref, k_ref, v_ref, b_ref, g_ref, *refs, sub, given_inverse):
    if given_inverse:
        x_in_ref, w_ref, u_ref, qk_ref = refs
    else:
        w_ref, u_ref, qk_ref, x_ref = refs
    C = k_ref.shape[0]
    m = C // sub
    cd = k_ref.dtype
    G = g_ref[...]
    qk_ref[...] = (_dot_nt(q_ref[...], k_ref[...]) * _decay(G, G, "causal")).astype(qk_ref.dtype)

    rs = [pl.ds(i * sub, sub) for i in range(m)]
    Gs = [g_ref[r, :] for r in rs]
    bs = [b_ref[r, :].astype(f32) for r in rs]
    ks = [k_ref[r, :] for r in rs]
    if given_inverse:
        X = {(i, j): x_in_ref[rs[i], rs[j]] for i in range(m) for j in range(i + 1)}
    else:
        A = {(i, j): bs[i] * _dot_nt(ks[i], ks[j]) * _decay(Gs[i], Gs[j], "strict" if i == j else None)
             for i in range(m) for j in range(i + 1)}
        X = {(i, i): _invert_diag_block(A[i, i]) for i in range(m)}
        for i in range(1, m):
            for j in range(i):
                acc = _dot(A[i, j], X[j, j])
                for l in range(j + 1, i):
                    acc = acc + _dot(A[i, l], X[l, j])
                X[i, j] = -_dot(X[i, i], acc)
        for i in range(m):
            for j in range(m):
                x_ref[rs[i], rs[j]] = X[i, j] if j <= i else jnp.zeros((sub, sub), f32)
    kb = [(bs[j] * jnp.exp(Gs[j]) * ks[j].astype(f32)).astype(cd) for j in range(m)]
    vb = [(bs[j] * v_ref[rs[j], :].astype(f32)).astype(cd) for j in range(m)]
    for i in range(m):
        w = sum(_dot(X[i, j].astype(cd), kb[j]) for j in range(i + 1))
        u = sum(_dot(X[i, j].astype(cd), vb[j]) for j in range(i + 1))
        w_ref[rs[i], :] = w.astype(w_ref.dtype)
        u_ref[rs[i], :] = u.astype(u_ref.dtype)


def _wy_bwd_kernel(q_ref, k_ref, v_ref, b_ref, g_ref, x_ref, dw_ref, du_ref, dqk_ref,
                   dq_in_ref, dk_in_ref, dg_in_ref, dq_ref, dk_ref, dv_ref, db_ref, dg_ref):
    cd = k_ref.dtype
    G, beta = g_ref[...], b_ref[...].astype(f32)
    k = k_ref[...]
    # QK = (q k^T) o Dc
    F = dqk_ref[...].astype(f32) * _decay(G, G, "causal")
    q = q_ref[...]
    P = F * _dot_nt(q, k)                                      # dQK o QK
    Fc = F.astype(cd)
    dq_ref[...] = dq_in_ref[...] + _dot(Fc, k)
    dk = dk_in_ref[...] + _dot(Fc, q, trans_a=True)
    dG = dg_in_ref[...] + jnp.sum(P, axis=1, keepdims=True) - jnp.sum(P.T, axis=1, keepdims=True)
    # w = X kb, u = X vb
    X = x_ref[...]
    Xc = X.astype(cd)
    dw, du = dw_ref[...], du_ref[...]
    eG = jnp.exp(G)
    kf, vf = k.astype(f32), v_ref[...].astype(f32)
    kb = (beta * eG * kf).astype(cd)
    dX = _dot_nt(dw, kb) + _dot_nt(du, (beta * vf).astype(cd))
    dkb = _dot(Xc, dw, trans_a=True)
    dvb = _dot(Xc, du, trans_a=True)
    dv_ref[...] = beta * dvb
    db = jnp.sum(dkb * eG * kf, axis=1, keepdims=True) + jnp.sum(dvb * vf, axis=1, keepdims=True)
    dk += beta * eG * dkb
    dG += jnp.sum(dkb * kb.astype(f32), axis=1, keepdims=True)
    # A = diag(beta) (k k^T o D), X = (I + A)^-1
    dA = -_dot_nt(_dot(X, dX, trans_a=True), X)               # -(X^T dX) X^T
    kk = _dot_nt(k, k)
    E = dA * _decay(G, G, "strict")                            # zero on and above the diagonal
    bE = (beta * E).astype(cd)
    M = beta * E * kk                                          # dA o A
    dk_ref[...] = dk + _dot(bE, k) + _dot(bE, k, trans_a=True)
    db_ref[...] = db + jnp.sum(E * kk, axis=1, keepdims=True)
    dg_ref[...] = dG + jnp.sum(M, axis=1, keepdims=True) - jnp.sum(M.T, axis=1, keepdims=True)


# ---------------------------------------------------------------- launchers

def chunk_call(cfg, kernel, ins, outs, btH, *, name):
    """pallas_call of a one-chunk-per-program kernel.

    ins: (array, X) pairs, array [B, T, H, X] ("per token") or, with X None, [B, N, H, K, V]
    ("per chunk", one [K, V] block each); outs: (X, dtype) pairs of per-token outputs.
    Grid (B, N, H) on [B, T, H, X] arrays ("triton") or (B, H, N) on [B, H, T, X] ("tpu").
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
        params = _params(cfg, num_warps=cfg.chunk_warps)
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


def wy_forward(cfg, q, k, v, beta, G, X=None, *, sub=16):
    """w [B,T,H,K], u [B,T,H,V], QK [B,T,H,C] (k's dtype) and, unless X is given, X
    [B,T,H,C] fp32. q is the scaled query, beta and G [B, T, H]."""
    B, T, H, K = k.shape
    V, C = v.shape[-1], cfg.chunk
    cd = k.dtype
    ins = [(q, K), (k, K), (v, V), (beta[..., None], 1), (G[..., None], 1)]
    outs = [(K, cd), (V, cd), (C, cd)]
    if X is None:
        outs.append((C, f32))
    else:
        ins.append((X, C))
    return chunk_call(cfg, functools.partial(_wy_fwd_kernel, sub=min(sub, C),
                                             given_inverse=X is not None),
                      ins, outs, (B, T, H), name="gdn_wy_fwd")


def wy_backward(cfg, q, k, v, beta, G, X, dw, du, dqk, dq, dk, dG):
    """Adds the WY-path gradients to dq, dk, dG (fp32, from the state path) and returns
    (dq, dk, dv) fp32 [B,T,H,X], (dbeta, dG) fp32 [B, T, H]."""
    B, T, H, K = k.shape
    V, C = v.shape[-1], cfg.chunk
    dq, dk, dv, db, dG = chunk_call(
        cfg, _wy_bwd_kernel,
        [(q, K), (k, K), (v, V), (beta[..., None], 1), (G[..., None], 1), (X, C), (dw, K),
         (du, V), (dqk, C), (dq, K), (dk, K), (dG[..., None], 1)],
        [(K, f32), (K, f32), (V, f32), (1, f32), (1, f32)], (B, T, H), name="gdn_wy_bwd")
    return dq, dk, dv, db[..., 0], dG[..., 0]
