"""Gated DeltaNet in chunked WY/UT form, pure jnp: the plain-XLA fast path and the kernel's model.

Within a chunk of C tokens with local cumulative log decay G_i = sum_{j<=i} g_j and incoming
state S0 [K, V], unrolling the recurrence of ``reference.py`` gives for the corrected values U':

    (I + A) U' = beta*V - (beta*exp(G)*K) S0,    A_ij = beta_i exp(G_i - G_j) k_i.k_j  (j < i)

so with T = (I + A)^-1 (unit lower triangular):

    u = T (beta*V),   w = T (beta*exp(G)*K),   U' = u - w S0                (WY/UT form)
    O = (exp(G)*Q) S0 + tril(Q K^T * exp(G_i - G_j)) U'                     (j <= i)
    S_next = exp(G_last) S0 + (exp(G_last - G)*K)^T U'

Every decay is a difference of chunk-local cumulative gates, masked *before* ``exp`` so that the
masked entries (whose differences are positive and may be huge) never reach ``exp``: no Inf, no
NaN in values or gradients, for any g <= 0. Everything is fp32 at HIGHEST matmul precision.
T need not be a multiple of C: the tail is padded with q = k = v = beta = 0 and g = 0, which
leaves outputs and state unchanged.

T is formed by block forward substitution (``unit_lower_inverse``): matmuls only, exact
elimination (no power series), and no LAPACK triangular solve, whose XLA:CPU custom call
waits on a shared thread pool and deadlocked multi-device CPU programs.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from kernels_pallas.linear_scan.common import chunk_local_cumsum, pad_time

_HI = jax.lax.Precision.HIGHEST
_NEG = -1e30  # stands for -inf before exp; finite so that 0 * it stays 0 in gradients


def unit_lower_inverse(A, base: int = 16):
    """(I + A)^-1 for strictly lower-triangular A [..., C, C].

    A is zero-padded to base * 2^m (the padded inverse's top-left block is the inverse wanted).
    The m diagonal blocks of size ``base`` are inverted together, row by row (row i =
    e_i - A_i X, a ``fori_loop``: one body to compile instead of base - 1, which took a third
    of the compile time of a small GDN model's training step on the CPU); then neighbouring
    blocks are merged exactly, all pairs of a level at once: for [[A11, 0], [A21, A22]],
    X21 = -X22 A21 X11. Every step is a batched matmul, so the sequential depth is
    base - 1 + log2(m) whatever the batch, and there is no power series.
    """
    C = A.shape[-1]
    base = min(base, C)
    nb = 1 << max(0, (-(-C // base) - 1).bit_length())  # blocks, a power of 2
    P = nb * base
    if P != C:
        A = jnp.pad(A, [(0, 0)] * (A.ndim - 2) + [(0, P - C), (0, P - C)])
    lead = A.shape[:-2]
    # [..., nb, nb, base, base]: (block row, block column, row, column)
    Ab = jnp.swapaxes(A.reshape(*lead, nb, base, nb, base), -3, -2)
    D = jnp.moveaxis(jnp.diagonal(Ab, axis1=-4, axis2=-3), -1, -3)  # [..., nb, base, base]
    X = jnp.broadcast_to(jnp.eye(base, dtype=A.dtype), D.shape)

    def substitute(i, X):  # row i = e_i - D_i X (D_ij = 0 for j >= i: strictly lower)
        d = jax.lax.dynamic_index_in_dim(D, i, axis=-2, keepdims=False)
        row = jax.lax.dynamic_index_in_dim(X, i, axis=-2, keepdims=False)
        row = row - jnp.einsum("...j,...jk->...k", d, X, precision=_HI)
        return jax.lax.dynamic_update_index_in_dim(X, row, i, axis=-2)

    X = jax.lax.fori_loop(1, base, substitute, X)
    s, m = base, nb
    while m > 1:
        # sub-diagonal blocks A21 of each pair at this level, [..., m/2, s, s]
        Ab = jnp.swapaxes(A.reshape(*lead, m, s, m, s), -3, -2)
        A21 = jnp.moveaxis(jnp.diagonal(Ab[..., 1::2, 0::2, :, :], axis1=-4, axis2=-3), -1, -3)
        X11, X22 = X[..., 0::2, :, :], X[..., 1::2, :, :]
        X21 = -jnp.einsum("...ij,...jk,...kl->...il", X22, A21, X11, precision=_HI)
        top = jnp.concatenate([X11, jnp.zeros_like(X11)], axis=-1)
        X = jnp.concatenate([top, jnp.concatenate([X21, X22], axis=-1)], axis=-2)
        s, m = 2 * s, m // 2
    return X[..., 0, :C, :C]


def wy_representation(k, v, beta, g_cum):
    """Per-chunk w, u of the UT transform.

    Args (chunked, fp32): k [..., C, K], v [..., C, V], beta [..., C], g_cum [..., C].
    Returns w [..., C, K], u [..., C, V].
    """
    C = k.shape[-2]
    diff = g_cum[..., :, None] - g_cum[..., None, :]
    strict = jnp.tril(jnp.ones((C, C), bool), -1)
    decay = jnp.exp(jnp.where(strict, diff, _NEG))
    kk = jnp.einsum("...ik,...jk->...ij", k, k, precision=_HI)
    A = beta[..., :, None] * kk * decay  # strictly lower
    Tinv = unit_lower_inverse(A)
    u = jnp.einsum("...ij,...jv->...iv", Tinv, beta[..., None] * v, precision=_HI)
    w = jnp.einsum(
        "...ij,...jk->...ik", Tinv, (beta * jnp.exp(g_cum))[..., None] * k, precision=_HI
    )
    return w, u


def gated_delta_rule_chunk_reference(
    q, k, v, g, beta, *, scale=None, initial_state=None, output_final_state=False, chunk_size=64
):
    """Chunked GDN; same signature and layout as the recurrent reference."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    C = chunk_size
    scale = K**-0.5 if scale is None else scale
    f32 = jnp.float32
    out_dtype = v.dtype
    pad = (-T) % C
    q, k, v, g, beta = (pad_time(a.astype(f32), pad) for a in (q, k, v, g, beta))
    Tp = T + pad
    N = Tp // C
    g_cum = chunk_local_cumsum(g, C)

    # [B, T, H, X] -> [N, B, H, C, X]: chunks lead so that lax.scan walks them.
    def chunks(x):
        x = x.reshape(B, N, C, H, -1)
        return jnp.transpose(x, (1, 0, 3, 2, 4))

    qc, kc, vc = chunks(q * scale), chunks(k), chunks(v)
    bc, gc = chunks(beta)[..., 0], chunks(g_cum)[..., 0]  # [N, B, H, C]
    w, u = wy_representation(kc, vc, bc, gc)

    C_idx = jnp.arange(C)
    causal = C_idx[:, None] >= C_idx[None, :]
    intra_decay = jnp.exp(jnp.where(causal, gc[..., :, None] - gc[..., None, :], _NEG))
    qk = jnp.einsum("...ik,...jk->...ij", qc, kc, precision=_HI) * intra_decay
    q_dec = qc * jnp.exp(gc)[..., None]
    g_last = gc[..., -1:]
    k_dec = kc * jnp.exp(g_last - gc)[..., None]

    def body(S, xs):
        w_n, u_n, qk_n, q_dec_n, k_dec_n, g_last_n = xs
        v_new = u_n - jnp.einsum("bhck,bhkv->bhcv", w_n, S, precision=_HI)
        o = jnp.einsum("bhck,bhkv->bhcv", q_dec_n, S, precision=_HI) + jnp.einsum(
            "bhij,bhjv->bhiv", qk_n, v_new, precision=_HI
        )
        S = jnp.exp(g_last_n)[..., None] * S + jnp.einsum(
            "bhck,bhcv->bhkv", k_dec_n, v_new, precision=_HI
        )
        return S, o

    S0 = jnp.zeros((B, H, K, V), f32) if initial_state is None else initial_state.astype(f32)
    S, o = jax.lax.scan(body, S0, (w, u, qk, q_dec, k_dec, g_last))
    o = jnp.transpose(o, (1, 0, 3, 2, 4)).reshape(B, Tp, H, V)[:, :T]
    return o.astype(out_dtype), (S if output_final_state else None)
