"""The inter-chunk pass of a chunked gated linear recurrence as Pallas kernels, forward and
backward: Gated DeltaNet's (``kernels_pallas.gdn``), and with w = 0 and u = v the recurrence
of linear attention with a scalar decay (``kernels_pallas.decay_attention``).

The chunk-parallel part of GDN's WY/UT form (``gdn/pallas.py``) leaves, for each chunk n of C tokens
of one (batch, head): the scaled queries q and keys k [C, K], w [C, K], u [C, V], the masked
intra-chunk scores QK [C, C] (QK_ij = q_i.k_j exp(G_i - G_j), j <= i) and the chunk-local
cumulative log gates G [C]. What is left is sequential over chunks and independent across
(batch, head, block of BV value columns); the state S [K, BV] stays in registers / VMEM:

    forward                                   backward (dS = dL/dS_{n+1}, walking n down)
    v_n     = u_n - w_n S_n                     dv_n  = QK_n^T do_n + kd_n dS
    o_n     = qd_n S_n + QK_n v_n               dS   <- e^{G_last} dS + qd_n^T do_n - w_n^T dv_n
    S_{n+1} = e^{G_last} S_n + kd_n^T v_n

with qd = q e^G and kd = k e^{G_last - G}, both <= 1 in size since G falls within a chunk.
The backward kernel needs S_n, recomputed by the forward kernel (``store=True`` writes S_n and
v_n); nothing but the inputs is kept between the passes. Without the delta rule (``w=None``:
w = 0, v = u) the kernels neither read w nor form its products, the forward stores S_n only,
and ``state_grads`` leaves dw out. Everything the kernels do not need
sequentially (dq, dk, dw, dQK, dG from S_n, dS_{n+1}, v_n, dv_n) is batched matmuls in XLA.

Two launch layouts run the same per-chunk bodies:
  "triton" (GPU, and the generic interpreter): grid (B, H, V/BV); each program walks its N
           chunks in a ``fori_loop``, reading the [B, T, H, X] arrays in place.
  "tpu"    (Mosaic, and ``pltpu.InterpretParams``): grid (B, H, V/BV, N), the chunk axis
           "arbitrary", the state in a VMEM scratch; arrays in [B, H, T, X] so that blocks are
           (C, K) tiles and BV is V or a multiple of 128.
Matmul operands are in the inputs' dtype (bf16 in training) with fp32 accumulation; the state
and its gradient are carried in fp32 and stored for the backward (S_n, dS_{n+1}, v, dv) in the
inputs' dtype (fp32 for Triton at K > 128: ``store_dtype``).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from kernels_pallas.linear_scan.common import chunk_call, col_blocks, compiler_params, dot, dot_nt, f32


# ---------------------------------------------------------------- per-chunk bodies (values)

def _last_row(G):
    """(is-last-row mask [C, 1], G_last [1, 1]) of a [C, 1] column (no value slicing: Triton)."""
    last = jax.lax.broadcasted_iota(jnp.int32, G.shape, 0) == G.shape[0] - 1
    return last, jnp.sum(jnp.where(last, G, 0.0), axis=0, keepdims=True)


def _decayed(q, k, G):
    """qd = q e^G, kd = k e^{G_last - G}, e^{G_last} [1, 1]; G is a [C, 1] column."""
    _, g_last = _last_row(G)
    qd = (q.astype(f32) * jnp.exp(G)).astype(q.dtype)
    kd = (k.astype(f32) * jnp.exp(g_last - G)).astype(k.dtype)
    return qd, kd, jnp.exp(g_last)


def _rows(ref, t):
    """ref[t, :], or None for an absent input (w without the delta rule)."""
    return None if ref is None else ref[t, :]


def _without_w(kernel):
    """``kernel`` for a call with no w input: its w_ref (the third) is None."""
    def run(q_ref, k_ref, *refs, **kw):
        return kernel(q_ref, k_ref, None, *refs, **kw)
    return run


def _fwd_chunk(S, q, k, w, u, qk, G):
    qd, kd, a_last = _decayed(q, k, G)
    Sc = S.astype(q.dtype)
    v = u.astype(f32) if w is None else u.astype(f32) - dot(w, Sc)
    vc = v.astype(q.dtype)
    o = dot(qd, Sc) + dot(qk, vc)
    return o, v, a_last * S + dot(kd, vc, trans_a=True)


def _bwd_chunk(dS, q, k, w, qk, G, do):
    qd, kd, a_last = _decayed(q, k, G)
    dv = dot(qk, do, trans_a=True) + dot(kd, dS.astype(q.dtype))
    dS = a_last * dS + dot(qd, do, trans_a=True)
    if w is not None:
        dS = dS - dot(w, dv.astype(q.dtype), trans_a=True)
    return dv, dS


# ---------------------------------------------------------------- "triton" layout kernels

def _fwd_kernel_loop(q_ref, k_ref, w_ref, u_ref, qk_ref, g_ref, s0_ref, o_ref, sN_ref,
                     *store_refs, n_chunks, chunk):
    def body(n, S):
        t = pl.ds(pl.multiple_of(n * chunk, chunk), chunk)
        if store_refs:
            store_refs[0][n, :, :] = S.astype(store_refs[0].dtype)
        o, v, S = _fwd_chunk(S, q_ref[t, :], k_ref[t, :], _rows(w_ref, t), u_ref[t, :],
                             qk_ref[t, :], g_ref[t, :])
        o_ref[t, :] = o.astype(o_ref.dtype)
        if len(store_refs) > 1:
            store_refs[1][t, :] = v.astype(store_refs[1].dtype)
        return S

    sN_ref[...] = jax.lax.fori_loop(0, n_chunks, body, s0_ref[...].astype(f32))


def _bwd_kernel_loop(q_ref, k_ref, w_ref, qk_ref, g_ref, do_ref, dsN_ref, dv_ref, dh_ref,
                     ds0_ref, *, n_chunks, chunk):
    def body(i, dS):
        n = n_chunks - 1 - i
        t = pl.ds(pl.multiple_of(n * chunk, chunk), chunk)
        dh_ref[n, :, :] = dS.astype(dh_ref.dtype)
        dv, dS = _bwd_chunk(dS, q_ref[t, :], k_ref[t, :], _rows(w_ref, t), qk_ref[t, :],
                            g_ref[t, :], do_ref[t, :])
        dv_ref[t, :] = dv.astype(dv_ref.dtype)
        return dS

    ds0_ref[...] = jax.lax.fori_loop(0, n_chunks, body, dsN_ref[...].astype(f32))


# ---------------------------------------------------------------- "tpu" layout kernels

def _fwd_kernel_grid(q_ref, k_ref, w_ref, u_ref, qk_ref, g_ref, s0_ref, o_ref, sN_ref,
                     *rest, n_chunks, store):
    store_refs, (S_scr,) = rest[:-1], rest[-1:]
    n = pl.program_id(3)

    @pl.when(n == 0)
    def _():
        S_scr[...] = s0_ref[...].astype(f32)

    S = S_scr[...]
    if store:
        store_refs[0][...] = S.astype(store_refs[0].dtype)
    o, v, S = _fwd_chunk(S, q_ref[...], k_ref[...], None if w_ref is None else w_ref[...],
                         u_ref[...], qk_ref[...], g_ref[...])
    o_ref[...] = o.astype(o_ref.dtype)
    if len(store_refs) > 1:
        store_refs[1][...] = v.astype(store_refs[1].dtype)
    S_scr[...] = S

    @pl.when(n == n_chunks - 1)
    def _():
        sN_ref[...] = S


def _bwd_kernel_grid(q_ref, k_ref, w_ref, qk_ref, g_ref, do_ref, dsN_ref, dv_ref, dh_ref,
                     ds0_ref, dS_scr, *, n_chunks):
    i = pl.program_id(3)

    @pl.when(i == 0)
    def _():
        dS_scr[...] = dsN_ref[...].astype(f32)

    dS = dS_scr[...]
    dh_ref[...] = dS.astype(dh_ref.dtype)
    dv, dS = _bwd_chunk(dS, q_ref[...], k_ref[...], None if w_ref is None else w_ref[...],
                        qk_ref[...], g_ref[...], do_ref[...])
    dv_ref[...] = dv.astype(dv_ref.dtype)
    dS_scr[...] = dS

    @pl.when(i == n_chunks - 1)
    def _():
        ds0_ref[...] = dS


# ---------------------------------------------------------------- state-path gradients

def _state_grads_kernel(q_ref, k_ref, g_ref, h_ref, dh_ref, v_ref, dv_ref, do_ref,
                        dq_ref, dk_ref, dw_ref, dqk_ref, dg_ref, *, blk):
    """One chunk: the gradients that flow through the state, from S_n (h), dS_{n+1} (dh), the
    corrected values v and their cotangents dv. K and V in blocks of ``blk``: three [C, blk]
    fp32 accumulators live at a time."""
    C, K = k_ref.shape
    V = h_ref.shape[-1]
    cd = k_ref.dtype
    G = g_ref[...]
    last, g_last = _last_row(G)
    kblocks, vblocks = col_blocks(K, blk), col_blocks(V, blk)
    dqk = jnp.zeros((C, C), f32)
    hdh = jnp.zeros((1, 1), f32)
    from_q = jnp.zeros((C, 1), f32)
    from_k = jnp.zeros((C, 1), f32)
    for i, ck in enumerate(kblocks):
        dqd = jnp.zeros((C, ck.size), f32)
        dw = None if dw_ref is None else jnp.zeros((C, ck.size), f32)
        dkd = jnp.zeros((C, ck.size), f32)
        for cv in vblocks:
            h, dh = h_ref[ck, cv], dh_ref[ck, cv]
            do, v = do_ref[:, cv], v_ref[:, cv].astype(cd)
            hc = h.astype(cd)
            dqd += dot_nt(do, hc)
            if dw is not None:
                dw -= dot_nt(dv_ref[:, cv].astype(cd), hc)
            dkd += dot_nt(v, dh.astype(cd))
            hdh += jnp.sum(jnp.sum(h.astype(f32) * dh.astype(f32), axis=1, keepdims=True),
                           axis=0, keepdims=True)
            if i == 0:
                dqk += dot_nt(do, v)
        dq = dqd * jnp.exp(G)
        dk = dkd * jnp.exp(g_last - G)
        from_q += jnp.sum(dq * q_ref[:, ck].astype(f32), axis=1, keepdims=True)
        from_k += jnp.sum(dk * k_ref[:, ck].astype(f32), axis=1, keepdims=True)
        dq_ref[:, ck] = dq
        dk_ref[:, ck] = dk
        if dw is not None:
            dw_ref[:, ck] = dw.astype(dw_ref.dtype)
    d_last = jnp.sum(from_k, axis=0, keepdims=True) + jnp.exp(g_last) * hdh
    dg_ref[...] = from_q - from_k + jnp.where(last, d_last, 0.0)
    dqk_ref[...] = dqk.astype(dqk_ref.dtype)


# ---------------------------------------------------------------- launchers

def _to_bhtx(x):
    return jnp.swapaxes(x, 1, 2)


def store_dtype(cfg, dtype, K):
    """dtype in which S_n, dS_{n+1}, v and dv are stored for the backward: the inputs' (bf16
    halves the traffic of the [B, N, H, K, V] states, as fla), but fp32 for Triton at K > 128.
    On the H200 the bf16 stores failed to compile at K = 256, BV = 64 ("Shared memory size limit
    exceeded: requested 262656, available: 232448") where the fp32 stores of the same kernels
    compile and run: the scan loops double-buffer [C, K] tiles of q, k and w (2 x 3 x 32 KiB at
    K = 256), and the excess is one [K, BV] bf16 tile (32 KiB), the store's layout conversion."""
    return f32 if cfg.layout == "triton" and K > 128 else dtype


def scan_forward(cfg, q, k, w, u, qk, G, S0, *, store=False):
    """Forward kernel. [B, T, H, X] inputs (T a multiple of the chunk; w None: no delta rule),
    G [B, T, H] fp32, S0 [B, H, K, V] fp32. Returns o [B, T, H, V] (u's dtype), S_N, and with
    ``store`` also S_n for every chunk [B, N, H, K, V] and (with w) v [B, T, H, V], in
    ``store_dtype``."""
    B, T, H, K = q.shape
    delta = w is not None
    ws = (w,) if delta else ()
    sd = store_dtype(cfg, q.dtype, K)
    V = u.shape[-1]
    C, BV = cfg.chunk, cfg.block_v
    N, NV = T // C, V // BV
    sq = pl.squeezed
    out_shape = [jax.ShapeDtypeStruct((B, T, H, V), u.dtype),
                 jax.ShapeDtypeStruct((B, H, K, V), f32)]
    if cfg.layout == "triton":
        if store:
            out_shape += [jax.ShapeDtypeStruct((B, N, H, K, V), sd)]
            out_shape += [jax.ShapeDtypeStruct((B, T, H, V), sd)] if delta else []
        seq = lambda X: pl.BlockSpec((sq, T, sq, X), lambda b, h, j: (b, 0, h, 0))  # noqa: E731
        seq_v = pl.BlockSpec((sq, T, sq, BV), lambda b, h, j: (b, 0, h, j))
        state = pl.BlockSpec((sq, sq, K, BV), lambda b, h, j: (b, h, 0, j))
        outs = [seq_v, state]
        if store:
            outs += [pl.BlockSpec((sq, N, sq, K, BV), lambda b, h, j: (b, 0, h, 0, j))]
            outs += [seq_v] if delta else []
        res = pl.pallas_call(
            functools.partial(_fwd_kernel_loop if delta else _without_w(_fwd_kernel_loop),
                              n_chunks=N, chunk=C),
            grid=(B, H, NV),
            in_specs=[seq(K), seq(K)] + [seq(K)] * delta + [seq_v, seq(C), seq(1), state],
            out_specs=outs, out_shape=out_shape, interpret=cfg.interpret,
            name="gdn_scan_fwd" if delta else "linear_scan_fwd", **compiler_params(cfg),
        )(q, k, *ws, u, qk, G[..., None], S0)
        return tuple(res)

    # "tpu": [B, H, T, X], one chunk per grid step along the last ("arbitrary") axis.
    from jax.experimental.pallas import tpu as pltpu
    if store:
        out_shape += [jax.ShapeDtypeStruct((B, H, N, K, V), sd)]
        out_shape += [jax.ShapeDtypeStruct((B, H, T, V), sd)] if delta else []
    out_shape[0] = jax.ShapeDtypeStruct((B, H, T, V), u.dtype)
    blk = lambda X: pl.BlockSpec((sq, sq, C, X), lambda b, h, j, n: (b, h, n, 0))  # noqa: E731
    blk_v = pl.BlockSpec((sq, sq, C, BV), lambda b, h, j, n: (b, h, n, j))
    state = pl.BlockSpec((sq, sq, K, BV), lambda b, h, j, n: (b, h, 0, j))
    outs = [blk_v, state]
    if store:
        outs += [pl.BlockSpec((sq, sq, sq, K, BV), lambda b, h, j, n: (b, h, n, 0, j))]
        outs += [blk_v] if delta else []
    res = pl.pallas_call(
        functools.partial(_fwd_kernel_grid if delta else _without_w(_fwd_kernel_grid),
                          n_chunks=N, store=store),
        grid=(B, H, NV, N),
        in_specs=[blk(K), blk(K)] + [blk(K)] * delta + [blk_v, blk(C), blk(1), state],
        out_specs=outs, out_shape=out_shape,
        scratch_shapes=[pltpu.VMEM((K, BV), f32)], interpret=cfg.interpret,
        name="gdn_scan_fwd" if delta else "linear_scan_fwd", **compiler_params(cfg),
    )(*(_to_bhtx(x) for x in (q, k, *ws, u, qk, G[..., None])), S0)
    o, sN = _to_bhtx(res[0]), res[1]
    if not store:
        return o, sN
    return (o, sN, jnp.swapaxes(res[2], 1, 2)) + ((_to_bhtx(res[3]),) if delta else ())


def scan_backward(cfg, q, k, w, qk, G, do, dSN):
    """Backward kernel: dv [B, T, H, V] and dS_{n+1} for every chunk [B, N, H, K, V] (in
    ``store_dtype``) and dS_0 (fp32), given the cotangents do [B, T, H, V] and dS_N [B, H, K, V]
    (w None: no delta rule)."""
    B, T, H, K = q.shape
    delta = w is not None
    ws = (w,) if delta else ()
    sd = store_dtype(cfg, q.dtype, K)
    V = do.shape[-1]
    C, BV = cfg.chunk, cfg.block_v
    N, NV = T // C, V // BV
    sq = pl.squeezed
    if cfg.layout == "triton":
        out_shape = [jax.ShapeDtypeStruct((B, T, H, V), sd),
                     jax.ShapeDtypeStruct((B, N, H, K, V), sd),
                     jax.ShapeDtypeStruct((B, H, K, V), f32)]
        seq = lambda X: pl.BlockSpec((sq, T, sq, X), lambda b, h, j: (b, 0, h, 0))  # noqa: E731
        seq_v = pl.BlockSpec((sq, T, sq, BV), lambda b, h, j: (b, 0, h, j))
        state = pl.BlockSpec((sq, sq, K, BV), lambda b, h, j: (b, h, 0, j))
        dv, dh, dS0 = pl.pallas_call(
            functools.partial(_bwd_kernel_loop if delta else _without_w(_bwd_kernel_loop),
                              n_chunks=N, chunk=C),
            grid=(B, H, NV),
            in_specs=[seq(K), seq(K)] + [seq(K)] * delta + [seq(C), seq(1), seq_v, state],
            out_specs=[seq_v, pl.BlockSpec((sq, N, sq, K, BV), lambda b, h, j: (b, 0, h, 0, j)),
                       state],
            out_shape=out_shape, interpret=cfg.interpret,
            name="gdn_scan_bwd" if delta else "linear_scan_bwd", **compiler_params(cfg),
        )(q, k, *ws, qk, G[..., None], do, dSN)
        return dv, dh, dS0

    from jax.experimental.pallas import tpu as pltpu
    out_shape = [jax.ShapeDtypeStruct((B, H, T, V), sd),
                 jax.ShapeDtypeStruct((B, H, N, K, V), sd),
                 jax.ShapeDtypeStruct((B, H, K, V), f32)]
    last = N - 1
    blk = lambda X: pl.BlockSpec((sq, sq, C, X),  # noqa: E731
                                 lambda b, h, j, i: (b, h, last - i, 0))
    blk_v = pl.BlockSpec((sq, sq, C, BV), lambda b, h, j, i: (b, h, last - i, j))
    state = pl.BlockSpec((sq, sq, K, BV), lambda b, h, j, i: (b, h, 0, j))
    dv, dh, dS0 = pl.pallas_call(
        functools.partial(_bwd_kernel_grid if delta else _without_w(_bwd_kernel_grid),
                          n_chunks=N),
        grid=(B, H, NV, N),
        in_specs=[blk(K), blk(K)] + [blk(K)] * delta + [blk(C), blk(1), blk_v, state],
        out_specs=[blk_v,
                   pl.BlockSpec((sq, sq, sq, K, BV), lambda b, h, j, i: (b, h, last - i, 0, j)),
                   state],
        out_shape=out_shape, scratch_shapes=[pltpu.VMEM((K, BV), f32)],
        interpret=cfg.interpret, name="gdn_scan_bwd" if delta else "linear_scan_bwd",
        **compiler_params(cfg),
    )(*(_to_bhtx(x) for x in (q, k, *ws, qk, G[..., None], do)), dSN)
    return _to_bhtx(dv), jnp.swapaxes(dh, 1, 2), dS0


def _state_grads_kernel_no_dw(*refs, blk):
    """``_state_grads_kernel`` with no dw output (its 11th ref, None here)."""
    return _state_grads_kernel(*refs[:10], None, *refs[10:], blk=blk)


def state_grads(cfg, q, k, G, h, dh, v, dv, do, *, with_dw=True):
    """Per chunk, in parallel: dq, dk (fp32) of the state path, dw (None unless ``with_dw``),
    dQK (q's dtype) and dG (fp32 [B, T, H]) from S_n (h) and dS_{n+1} (dh) [B, N, H, K, V], v,
    dv, do [B, T, H, V]."""
    B, T, H, K = q.shape
    V, C = v.shape[-1], cfg.chunk
    kernel = _state_grads_kernel if with_dw else _state_grads_kernel_no_dw
    outs = chunk_call(
        cfg, functools.partial(kernel, blk=cfg.chunk_block),
        [(q, K), (k, K), (G[..., None], 1), (h, None), (dh, None), (v, V), (dv, V), (do, V)],
        [(K, f32), (K, f32)] + [(K, q.dtype)] * with_dw + [(C, q.dtype), (1, f32)], (B, T, H),
        name="gdn_state_grads" if with_dw else "linear_state_grads")
    dq, dk, *dw, dqk, dG = outs
    return dq, dk, (dw[0] if with_dw else None), dqk, dG[..., 0]
