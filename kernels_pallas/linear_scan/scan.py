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

with qd = q e^G and kd = k e^{G_last - G}, both <= 1 in size since G falls within a chunk
(both walks can take q unscaled and its scale, folded into e^G: their ``q_scale``).
Only the state's own recurrence is sequential; the kernels carry no more than it needs:
  forward    ``scan_forward``: one fused kernel, o and v as it walks, storing S_n and v_n
             under differentiation (the delta rule's); ``scan_forward(q=None, store=True)``:
             the state alone (v as well with the delta rule), storing S_n (and v_n): without
             the delta rule, ``decay_attention/pallas.py`` then forms o_n = qd_n S_n +
             QK_n v_n in parallel over chunks (one matmul a chunk in the walk instead of three).
  backward   ``scan_backward``: dS walking down (with the delta rule also dv_n, which dS
             needs; without it, k and qk None, dS alone); then, with the delta rule,
             ``state_grads``, parallel over chunks: dq, dk, dw, dG through the state from
             S_n, dS_{n+1}, v_n, dv_n and through the scores QK (without the delta rule:
             ``decay_attention/pallas.py``'s chunk-parallel kernels).
Splitting the walks as fla's chunk kernels do shortens the sequential chain, whose latency
times the number of chunks is the scans' time when (batch, head, value block) programs are
few (long sequences, small batches).

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

from kernels_pallas.linear_scan.chunk_math import (
    chunk_output,
    k_decayed,
    last_row,
    q_decayed,
    times,
)
from kernels_pallas.linear_scan.common import (
    chunk_call,
    col_blocks,
    column,
    compiler_params,
    dot,
    dot_nt,
    f32,
    ref_all,
    ref_rows,
    scan_specs,
    with_absent,
)

# ---------------------------------------------------------------- per-chunk bodies (values)


def _fwd_chunk(S, q, k, w, u, qk, G, q_scale=1.0):
    """(o or None without q, v, S_{n+1}) of one chunk; q times ``q_scale`` (QK already)."""
    kd, a_last = k_decayed(k, G)
    Sc = S.astype(k.dtype)
    v = u.astype(f32) if w is None else u.astype(f32) - dot(w, Sc)
    vc = v.astype(k.dtype)
    o = None if q is None else chunk_output(q, qk, G, Sc, vc, q_scale)
    return o, v, (S if a_last is None else a_last * S) + dot(kd, vc, trans_a=True)


def _bwd_chunk(dS, q, k, w, qk, G, do, q_scale=1.0):
    """(dv or None without k, dS_n) of one chunk, from dS = dS_{n+1}; q times ``q_scale``."""
    dv = None
    if k is not None:
        kd, _ = k_decayed(k, G)
        dv = dot(qk, do, trans_a=True) + dot(kd, dS.astype(q.dtype))
    if G is not None:
        dS = jnp.exp(last_row(G)[1]) * dS
    dS = dS + dot(q_decayed(q, G, q_scale), do, trans_a=True)
    if w is not None:
        dS = dS - dot(w, dv.astype(q.dtype), trans_a=True)
    return dv, dS


# ---------------------------------------------------------------- "triton" layout kernels


def _fwd_kernel_loop(
    q_ref,
    k_ref,
    w_ref,
    u_ref,
    qk_ref,
    g_ref,
    s0_ref,
    o_ref,
    sN_ref,
    *store_refs,
    n_chunks,
    chunk,
    q_scale,
):
    def body(n, S):
        t = pl.ds(pl.multiple_of(n * chunk, chunk), chunk)
        if store_refs:
            store_refs[0][n, :, :] = S.astype(store_refs[0].dtype)
        o, v, S = _fwd_chunk(
            S,
            ref_rows(q_ref, t),
            k_ref[t, :],
            ref_rows(w_ref, t),
            u_ref[t, :],
            ref_rows(qk_ref, t),
            ref_rows(g_ref, t),
            q_scale,
        )
        if o_ref is not None:
            o_ref[t, :] = o.astype(o_ref.dtype)
        if len(store_refs) > 1:
            store_refs[1][t, :] = v.astype(store_refs[1].dtype)
        return S

    sN_ref[...] = jax.lax.fori_loop(0, n_chunks, body, s0_ref[...].astype(f32))


def _bwd_kernel_loop(
    q_ref,
    k_ref,
    w_ref,
    qk_ref,
    g_ref,
    do_ref,
    dsN_ref,
    dv_ref,
    dh_ref,
    ds0_ref,
    *,
    n_chunks,
    chunk,
    q_scale,
):
    def body(i, dS):
        n = n_chunks - 1 - i
        t = pl.ds(pl.multiple_of(n * chunk, chunk), chunk)
        dh_ref[n, :, :] = dS.astype(dh_ref.dtype)
        dv, dS = _bwd_chunk(
            dS,
            q_ref[t, :],
            ref_rows(k_ref, t),
            ref_rows(w_ref, t),
            ref_rows(qk_ref, t),
            ref_rows(g_ref, t),
            do_ref[t, :],
            q_scale,
        )
        if dv_ref is not None:
            dv_ref[t, :] = dv.astype(dv_ref.dtype)
        return dS

    ds0_ref[...] = jax.lax.fori_loop(0, n_chunks, body, dsN_ref[...].astype(f32))


# ---------------------------------------------------------------- "tpu" layout kernels


def _fwd_kernel_grid(
    q_ref,
    k_ref,
    w_ref,
    u_ref,
    qk_ref,
    g_ref,
    s0_ref,
    o_ref,
    sN_ref,
    *rest,
    n_chunks,
    store,
    q_scale,
):
    store_refs, (S_scr,) = rest[:-1], rest[-1:]
    n = pl.program_id(3)

    @pl.when(n == 0)
    def _():
        S_scr[...] = s0_ref[...].astype(f32)

    S = S_scr[...]
    if store:
        store_refs[0][...] = S.astype(store_refs[0].dtype)
    o, v, S = _fwd_chunk(
        S,
        ref_all(q_ref),
        k_ref[...],
        ref_all(w_ref),
        u_ref[...],
        ref_all(qk_ref),
        ref_all(g_ref),
        q_scale,
    )
    if o_ref is not None:
        o_ref[...] = o.astype(o_ref.dtype)
    if len(store_refs) > 1:
        store_refs[1][...] = v.astype(store_refs[1].dtype)
    S_scr[...] = S

    @pl.when(n == n_chunks - 1)
    def _():
        sN_ref[...] = S


def _bwd_kernel_grid(
    q_ref,
    k_ref,
    w_ref,
    qk_ref,
    g_ref,
    do_ref,
    dsN_ref,
    dv_ref,
    dh_ref,
    ds0_ref,
    dS_scr,
    *,
    n_chunks,
    q_scale,
):
    i = pl.program_id(3)

    @pl.when(i == 0)
    def _():
        dS_scr[...] = dsN_ref[...].astype(f32)

    dS = dS_scr[...]
    dh_ref[...] = dS.astype(dh_ref.dtype)
    dv, dS = _bwd_chunk(
        dS,
        q_ref[...],
        ref_all(k_ref),
        ref_all(w_ref),
        ref_all(qk_ref),
        ref_all(g_ref),
        do_ref[...],
        q_scale,
    )
    if dv_ref is not None:
        dv_ref[...] = dv.astype(dv_ref.dtype)
    dS_scr[...] = dS

    @pl.when(i == n_chunks - 1)
    def _():
        ds0_ref[...] = dS


# ---------------------------------------------------------------- state-path gradients


def _state_grads_kernel(
    q_ref,
    k_ref,
    g_ref,
    h_ref,
    dh_ref,
    v_ref,
    dv_ref,
    do_ref,
    dq_ref,
    dk_ref,
    dw_ref,
    dg_ref,
    *,
    blk,
    q_scale,
):
    """One chunk of the delta rule: the gradients that flow through the state, from S_n (h),
    dS_{n+1} (dh), the corrected values v and their cotangents dv, and those through the
    intra-chunk scores QK = q_scale (q k^T) o Dc (o = ... + QK v), from F = q_scale dQK o Dc,
    dQK = do v^T: dq += F k (dq of the unscaled query), dk += F^T q. Their dG, rowsum(F o QK')
    - colsum(F o QK') with QK' = q k^T, is rowsum(q o F k) - rowsum(k o F^T q), which the
    totals' rowsum(dq o q) - rowsum(dk o k) already hold, so no [C, C] product of q k^T is
    formed. The chunk's last row also takes the gradient of G_last, through the state only:
    sum(k o dk_state) + e^{G_last} sum(S_n o dS_{n+1}), summed from the state path's dk alone
    (not as the total's sum less the scores' part: that difference would leave a rounding
    residue where the state's gradient is exactly 0, e.g. after the last position a loss
    reads, and dg would carry it to the chunk's earlier rows). K and V in blocks of ``blk``:
    three [C, blk] fp32 accumulators live at a time beside F (in the inputs' dtype). Without a
    decay (g_ref and dg_ref None) no exponentials and no dG."""
    C, K = k_ref.shape
    V = h_ref.shape[-1]
    cd = k_ref.dtype
    decay = g_ref is not None
    kblocks, vblocks = col_blocks(K, blk), col_blocks(V, blk)
    dqk = jnp.zeros((C, C), f32)
    for cv in vblocks:
        dqk += dot_nt(do_ref[:, cv], v_ref[:, cv].astype(cd))
    causal = jax.lax.broadcasted_iota(jnp.int32, (C, C), 0) >= jax.lax.broadcasted_iota(
        jnp.int32, (C, C), 1
    )
    if decay:
        G = g_ref[...]
        last, g_last = last_row(G)
        F = (dqk * (q_scale * jnp.exp(jnp.where(causal, G - G.T, -1e30)))).astype(cd)
        q_decay, k_decay = q_scale * jnp.exp(G), jnp.exp(g_last - G)
    else:
        F = jnp.where(causal, q_scale * dqk, 0.0).astype(cd)
        q_decay, k_decay = q_scale, None
    hdh = jnp.zeros((1, 1), f32)
    from_q = jnp.zeros((C, 1), f32)  # rowsum(dq o q), rowsum(dk o k) of the totals
    from_k = jnp.zeros((C, 1), f32)
    k_state = jnp.zeros((1, 1), f32)  # sum(k o dk_state): the state path's part of G_last's
    for ck in kblocks:
        q, k = q_ref[:, ck], k_ref[:, ck]
        dq = dot(F, k)
        dk_state = jnp.zeros((C, ck.size), f32)
        dw = jnp.zeros((C, ck.size), f32)
        for cv in vblocks:
            h, dh = h_ref[ck, cv], dh_ref[ck, cv]
            hc = h.astype(cd)
            dq += q_decay * dot_nt(do_ref[:, cv], hc)
            dw -= dot_nt(dv_ref[:, cv].astype(cd), hc)
            dk_state += times(dot_nt(v_ref[:, cv].astype(cd), dh.astype(cd)), k_decay)
            if decay:
                hdh += jnp.sum(
                    jnp.sum(h.astype(f32) * dh.astype(f32), axis=1, keepdims=True),
                    axis=0,
                    keepdims=True,
                )
        dk = dot(F, q, trans_a=True) + dk_state
        if decay:
            kf = k.astype(f32)
            k_state += jnp.sum(jnp.sum(dk_state * kf, axis=1, keepdims=True), axis=0, keepdims=True)
            from_q += jnp.sum(dq * q.astype(f32), axis=1, keepdims=True)
            from_k += jnp.sum(dk * kf, axis=1, keepdims=True)
        dq_ref[:, ck] = dq.astype(dq_ref.dtype)
        dk_ref[:, ck] = dk.astype(dk_ref.dtype)
        dw_ref[:, ck] = dw.astype(dw_ref.dtype)
    if decay:
        d_last = k_state + jnp.exp(g_last) * hdh
        dg_ref[...] = from_q - from_k + jnp.where(last, d_last, 0.0)


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


def _per_token(cfg, xs):
    """[B, T, H, X] arrays (None kept) in the kernels' layout ([B, H, T, X] for "tpu")."""
    return [x if x is None or cfg.layout != "tpu" else _to_bhtx(x) for x in xs]


def _scan_call(cfg, kernel, ins, outs, *, reverse, name):
    """pallas_call of a sequential scan kernel. ins: (array or None, spec name) pairs in the
    kernel's order, then the [B, H, K, V] state; outs: (shape name, dtype, present) triples
    ("tok_v": [B, T, H, V], "state", "chunks": [B, N, H, K, V]). The kernel sees None for each
    absent input or output, except absent trailing outputs, which it does not see (it takes
    its stored outputs as ``*store_refs``). Returns the outputs, None for the absent ones, in
    [B, T, H, X] / [B, N, H, K, V]."""
    B, T, H, K = next(x for x, n in ins if n == "K" and x is not None).shape
    V = next(x for x, n in ins if n == "V").shape[-1]
    N, tpu = T // cfg.chunk, cfg.layout == "tpu"
    s = scan_specs(cfg, B, H, T, K, V, reverse=reverse)
    spec = {
        "K": s["seq"](K),
        "C": s["seq"](cfg.chunk),
        "1": s["seq"](1),
        "V": s["seq_v"],
        "state": s["state"],
        "tok_v": s["seq_v"],
        "chunks": s["chunks"],
    }
    shape = {
        "tok_v": (B, H, T, V) if tpu else (B, T, H, V),
        "state": (B, H, K, V),
        "chunks": (B, H, N, K, V) if tpu else (B, N, H, K, V),
    }
    present = [x is not None for x, _ in ins] + [p for _, _, p in outs]
    while not present[-1]:
        present.pop()
    scratch = {}
    if tpu:
        from jax.experimental.pallas import tpu as pltpu

        scratch = {"scratch_shapes": [pltpu.VMEM((K, cfg.block_v), f32)]}
    args = [x for x, _ in ins if x is not None]
    res = pl.pallas_call(
        with_absent(kernel, present),
        grid=s["grid"],
        in_specs=[spec[n] for x, n in ins if x is not None],
        out_specs=[spec[n] for n, _, p in outs if p],
        out_shape=[jax.ShapeDtypeStruct(shape[n], dt) for n, dt, p in outs if p],
        interpret=cfg.interpret,
        name=name,
        **scratch,
        **compiler_params(cfg),
    )(*_per_token(cfg, args[:-1]), args[-1])
    kinds = iter(n for n, _, p in outs if p)
    back = {"tok_v": _to_bhtx, "chunks": lambda x: jnp.swapaxes(x, 1, 2), "state": lambda x: x}
    got = [back[next(kinds)](r) if tpu else r for r in res]
    it = iter(got)
    return tuple(next(it) if p else None for _, _, p in outs)


def scan_forward(cfg, q, k, w, u, qk, G, S0, *, store=False, q_scale=1.0):
    """Forward kernel. [B, T, H, X] inputs (T a multiple of the chunk; w None: no delta rule),
    G [B, T, H] fp32, S0 [B, H, K, V] fp32. Returns o [B, T, H, V] (u's dtype), S_N, and with
    ``store`` also S_n for every chunk [B, N, H, K, V] and (with w) v [B, T, H, V], in
    ``store_dtype``. With q and qk None (and ``store``) the kernel carries the state alone and o
    is None (without the delta rule ``decay_attention/pallas.py`` forms it from the stored S_n,
    in parallel over chunks). ``q_scale``: the outputs' q times it, in the kernel (folded into
    e^G; qk comes scaled), sparing XLA a pass over q."""
    K = k.shape[-1]
    outputs, delta = q is not None, w is not None
    if not (outputs or store):
        raise ValueError("scan_forward without q (no outputs) must store the chunk states")
    sd = store_dtype(cfg, k.dtype, K)
    N = k.shape[1] // cfg.chunk
    if cfg.layout == "triton":
        kernel = functools.partial(_fwd_kernel_loop, n_chunks=N, chunk=cfg.chunk, q_scale=q_scale)
    else:
        kernel = functools.partial(_fwd_kernel_grid, n_chunks=N, store=store, q_scale=q_scale)
    res = _scan_call(
        cfg,
        kernel,
        [(q, "K"), (k, "K"), (w, "K"), (u, "V"), (qk, "C"), (column(G), "1"), (S0, "state")],
        [
            ("tok_v", u.dtype, outputs),
            ("state", f32, True),
            ("chunks", sd, store),
            ("tok_v", sd, store and delta),
        ],
        reverse=False,
        name="gdn_scan_fwd" if delta else "linear_scan_fwd",
    )
    return res[:2] + (res[2:3] if store else ()) + (res[3:] if store and delta else ())


def scan_backward(cfg, q, k, w, qk, G, do, dSN, *, q_scale=1.0):
    """Backward kernel: dv [B, T, H, V] and dS_{n+1} for every chunk [B, N, H, K, V] (in
    ``store_dtype``) and dS_0 (fp32), given the cotangents do [B, T, H, V] and dS_N [B, H, K, V]
    (w None: no delta rule). With k and qk None (no delta rule only) the kernel walks dS alone
    and dv is None (the caller forms it in parallel over chunks). q times ``q_scale`` in the
    kernel, as in ``scan_forward``."""
    K = q.shape[-1]
    if k is None and (w is not None or qk is not None):
        raise ValueError("scan_backward without k: no delta rule (w None) and no qk")
    sd = store_dtype(cfg, q.dtype, K)
    N = q.shape[1] // cfg.chunk
    if cfg.layout == "triton":
        kernel = functools.partial(_bwd_kernel_loop, n_chunks=N, chunk=cfg.chunk, q_scale=q_scale)
    else:
        kernel = functools.partial(_bwd_kernel_grid, n_chunks=N, q_scale=q_scale)
    return _scan_call(
        cfg,
        kernel,
        [(q, "K"), (k, "K"), (w, "K"), (qk, "C"), (column(G), "1"), (do, "V"), (dSN, "state")],
        [("tok_v", sd, k is not None), ("chunks", sd, True), ("state", f32, True)],
        reverse=True,
        name="gdn_scan_bwd" if w is not None else "linear_scan_bwd",
    )


def state_grads(cfg, q, k, G, h, dh, v, dv, do, *, q_scale=1.0, dq_dtype=None):
    """Per chunk, in parallel: the gradients through the state and through the intra-chunk
    scores QK (``_state_grads_kernel``): dq (final: of the unscaled query q, in ``dq_dtype``,
    default q's), dk and dw in q's dtype (bf16 halves the traffic of dk and dw, written here
    and read by the WY backward; fp32 inputs keep fp32) and dG (fp32 [B, T, H]; None without
    a decay, G None) from S_n (h) and dS_{n+1} (dh) [B, N, H, K, V], v, dv, do [B, T, H, V]
    (the delta rule's; without it the decay family's own kernels take the chunk-parallel part:
    ``decay_attention/pallas.py``). The scores are QK = q_scale (q k^T) o Dc."""
    B, T, H, K = q.shape
    V, cd = v.shape[-1], q.dtype
    dq, dk, dw, dG = chunk_call(
        cfg,
        functools.partial(_state_grads_kernel, blk=cfg.chunk_block, q_scale=q_scale),
        [(q, K), (k, K), (column(G), 1), (h, None), (dh, None), (v, V), (dv, V), (do, V)],
        [(K, dq_dtype or cd), (K, cd), (K, cd), (1, None if G is None else f32)],
        (B, T, H),
        name="gdn_state_grads",
    )
    return dq, dk, dw, (None if dG is None else dG[..., 0])
