"""Linear attention with a decay per key dimension (GLA, HGRN-2) as Pallas kernels:
``decay_attention(impl="pallas")`` with g [B, T, H, K].

Per chunk of C tokens, with G [C, K] the chunk-local cumulative log decay (per key), qd =
q e^G, kd = k e^{G_last - G} and a = e^{G_last} [K] (every exponent <= 0):

    o_n     = qd S_n + QK_n v_n,   QK_ij = sum_k q_ik k_jk e^{G_ik - G_jk}  (j <= i)
    S_{n+1} = diag(a) S_n + kd^T v_n

The decay scales the state's rows (one per key). The scan kernels therefore carry the state
transposed, S^T [BV, K] per program: the decay is then a broadcast along rows, as the scalar
decay is, and every product is a plain or transposed matmul (o = qd (S^T)^T, S^T += v^T kd).

  QK        per chunk, ``intra_key.intra_scores``: Pallas kernels, stable for any decay
  forward   ``scan_forward``: sequential, the state S_n^T (fused with o when not
            differentiated; under differentiation storing S_n^T), then ``chunk_outputs``:
            o_n per chunk, in parallel
  backward  ``scan_backward``: dS_{n+1} per chunk and dS_0, walking the chunks down:
            dS_n = diag(a) dS_{n+1} + qd^T do_n;
            then per chunk, in parallel, ``state_grads``:
            dq = (do S_n^T) e^G,  dk = (v dS_{n+1}^T) e^{G_last - G},  dv = QK^T do + kd dS_{n+1},
            dQK = do v^T,  dG = q dq - k dk (+ on the last row sum_c k dk + a sum_v S dS);
            and ``intra_key.intra_grads``: dq, dk, dG through QK from dQK, added to those,
            and dg, dG summed over each position and the later ones of its chunk

G is formed by one kernel (``common.chunk_local_cumsum_pallas``). Under one
``jax.custom_vjp``; saved between the passes: the inputs, G, QK and the chunk states S_n
(``DecaySettings.recompute``: the inputs only, the forward scan rerun in the backward). Layouts
as ``kernels_pallas.linear_scan``: "triton" (grid (B, H, V/BV), a ``fori_loop`` over chunks)
and "tpu" (grid (B, H, V/BV, N), the state in VMEM scratch, [B, H, T, X] arrays).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from kernels_pallas.decay_attention.intra_key import intra_grads, intra_scores
from kernels_pallas.decay_attention.pallas import cast_inputs
from kernels_pallas.decay_attention.settings import DecaySettings
from kernels_pallas.linear_scan.common import (
    chunk_call,
    chunk_local_cumsum_pallas,
    col_blocks,
    compiler_params,
    dot,
    dot_nt,
    f32,
    kernel_config,
    pad_time,
    ref_all,
    ref_rows,
    scan_specs,
    with_absent,
)

# ---------------------------------------------------------------- per-chunk bodies (values)


def _decays(G):
    """e^G, e^{G_last - G} [C, K] and e^{G_last} [1, K] of a chunk's G [C, K] (fp32)."""
    last = jax.lax.broadcasted_iota(jnp.int32, G.shape, 0) == G.shape[0] - 1
    g_last = jnp.sum(jnp.where(last, G, 0.0), axis=0, keepdims=True)
    return jnp.exp(G), jnp.exp(g_last - G), jnp.exp(g_last)


def _scaled(x, e):
    """x * e in x's dtype (e fp32)."""
    return (x.astype(f32) * e).astype(x.dtype)


def _fwd_chunk(ST, q, k, v, qk, G):
    """(o or None without q, S_{n+1}^T) of one chunk."""
    eq, ek, a = _decays(G)
    o = None
    if q is not None:
        o = dot_nt(_scaled(q, eq), ST.astype(k.dtype)) + dot(qk, v)  # [C, BV]
    return o, a * ST + dot(v, _scaled(k, ek), trans_a=True)  # S^T [BV, K]


def _bwd_chunk(dST, q, G, do):
    eq, _, a = _decays(G)
    return a * dST + dot(do, _scaled(q, eq), trans_a=True)


# ---------------------------------------------------------------- sequential kernels


def _fwd_loop(q_ref, k_ref, v_ref, qk_ref, g_ref, s0_ref, o_ref, sN_ref, *store, n_chunks, chunk):
    def body(n, ST):
        t = pl.ds(pl.multiple_of(n * chunk, chunk), chunk)
        if store:
            store[0][n, :, :] = ST.astype(store[0].dtype)
        o, ST = _fwd_chunk(
            ST, ref_rows(q_ref, t), k_ref[t, :], v_ref[t, :], ref_rows(qk_ref, t), g_ref[t, :]
        )
        if o_ref is not None:
            o_ref[t, :] = o.astype(o_ref.dtype)
        return ST

    sN_ref[...] = jax.lax.fori_loop(0, n_chunks, body, s0_ref[...].astype(f32))


def _bwd_loop(q_ref, g_ref, do_ref, dsN_ref, dh_ref, ds0_ref, *, n_chunks, chunk):
    def body(i, dST):
        n = n_chunks - 1 - i
        t = pl.ds(pl.multiple_of(n * chunk, chunk), chunk)
        dh_ref[n, :, :] = dST.astype(dh_ref.dtype)
        return _bwd_chunk(dST, q_ref[t, :], g_ref[t, :], do_ref[t, :])

    ds0_ref[...] = jax.lax.fori_loop(0, n_chunks, body, dsN_ref[...].astype(f32))


def _fwd_grid(q_ref, k_ref, v_ref, qk_ref, g_ref, s0_ref, o_ref, sN_ref, *rest, n_chunks, store):
    store_refs, S_scr = rest[:-1], rest[-1]
    n = pl.program_id(3)

    @pl.when(n == 0)
    def _():
        S_scr[...] = s0_ref[...].astype(f32)

    ST = S_scr[...]
    if store:
        store_refs[0][...] = ST.astype(store_refs[0].dtype)
    o, ST = _fwd_chunk(ST, ref_all(q_ref), k_ref[...], v_ref[...], ref_all(qk_ref), g_ref[...])
    if o_ref is not None:
        o_ref[...] = o.astype(o_ref.dtype)
    S_scr[...] = ST

    @pl.when(n == n_chunks - 1)
    def _():
        sN_ref[...] = ST


def _bwd_grid(q_ref, g_ref, do_ref, dsN_ref, dh_ref, ds0_ref, dS_scr, *, n_chunks):
    i = pl.program_id(3)

    @pl.when(i == 0)
    def _():
        dS_scr[...] = dsN_ref[...].astype(f32)

    dST = dS_scr[...]
    dh_ref[...] = dST.astype(dh_ref.dtype)
    dST = _bwd_chunk(dST, q_ref[...], g_ref[...], do_ref[...])
    dS_scr[...] = dST

    @pl.when(i == n_chunks - 1)
    def _():
        ds0_ref[...] = dST


# ---------------------------------------------------------------- chunk-parallel kernels


def _outputs_kernel(q_ref, qk_ref, g_ref, h_ref, v_ref, o_ref, *, blk):
    """o = (q e^G) S_n + QK v of one chunk, from S_n^T (h) [V, K], ``blk`` value columns at a
    time."""
    cd = q_ref.dtype
    eq, _, _ = _decays(g_ref[...])
    qd, qk = _scaled(q_ref[...], eq), qk_ref[...]
    for cv in col_blocks(o_ref.shape[-1], blk):
        o = dot_nt(qd, h_ref[cv, :].astype(cd)) + dot(qk, v_ref[:, cv].astype(cd))
        o_ref[:, cv] = o.astype(o_ref.dtype)


def _state_grads_kernel(
    q_ref, k_ref, g_ref, h_ref, dh_ref, v_ref, do_ref, dq_ref, dk_ref, dqk_ref, dg_ref, *, blk
):
    """One chunk: dq, dk, dG through the state and dQK (lower triangle), from S_n^T (h) and
    dS_{n+1}^T (dh) [V, K], v and do; key and value columns in blocks of ``blk``:

        dq = (do S_n^T) e^G,  dk = (v dS_{n+1}^T) e^{G_last - G},  dQK = do v^T,
        dG = q dq - k dk,   and on the last row + sum_c k dk + e^{G_last} sum_v S_n dS_{n+1}."""
    C, K = k_ref.shape
    V = v_ref.shape[-1]
    cd = k_ref.dtype
    last = jax.lax.broadcasted_iota(jnp.int32, (C, 1), 0) == C - 1
    lower = jax.lax.broadcasted_iota(jnp.int32, (C, C), 0) >= jax.lax.broadcasted_iota(
        jnp.int32, (C, C), 1
    )
    dqk = jnp.zeros((C, C), f32)
    for cv in col_blocks(V, blk):  # first, so that dQK is not live in the rest
        dqk += dot_nt(do_ref[:, cv], v_ref[:, cv].astype(cd))
    dqk_ref[...] = jnp.where(lower, dqk, 0.0)
    for ck in col_blocks(K, blk):
        dqd = jnp.zeros((C, ck.size), f32)
        dkd = jnp.zeros((C, ck.size), f32)
        hdh = jnp.zeros((1, ck.size), f32)
        for cv in col_blocks(V, blk):
            h, dh = h_ref[cv, ck], dh_ref[cv, ck]
            dqd += dot(do_ref[:, cv], h.astype(cd))
            dkd += dot(v_ref[:, cv].astype(cd), dh.astype(cd))
            hdh += jnp.sum(h.astype(f32) * dh.astype(f32), axis=0, keepdims=True)
        eq, ek, a = _decays(g_ref[:, ck])
        dq, dk = dqd * eq, dkd * ek
        from_k = dk * k_ref[:, ck].astype(f32)
        d_last = jnp.sum(from_k, axis=0, keepdims=True) + a * hdh
        dq_ref[:, ck] = dq
        dk_ref[:, ck] = dk
        dg_ref[:, ck] = dq * q_ref[:, ck].astype(f32) - from_k + jnp.where(last, d_last, 0.0)


def _values_grad_kernel(k_ref, qk_ref, g_ref, dh_ref, do_ref, dv_ref, *, blk):
    """dv = QK^T do + (k e^{G_last - G}) dS_{n+1} of one chunk, from dS_{n+1}^T (dh) [V, K]."""
    cd = k_ref.dtype
    _, ek, _ = _decays(g_ref[...])
    kd, qk = _scaled(k_ref[...], ek), qk_ref[...]
    for cv in col_blocks(dv_ref.shape[-1], blk):
        dv = dot(qk, do_ref[:, cv], trans_a=True) + dot_nt(kd, dh_ref[cv, :].astype(cd))
        dv_ref[:, cv] = dv.astype(dv_ref.dtype)


# ---------------------------------------------------------------- launchers


def _per_token(cfg, xs):
    """[B, T, H, X] -> the kernels' layout ([B, H, T, X] for "tpu")."""
    return [jnp.swapaxes(x, 1, 2) if cfg.layout == "tpu" else x for x in xs]


def _chunk_states(cfg, shape, dtype):
    B, N, H, V, K = shape
    return jax.ShapeDtypeStruct((B, H, N, V, K) if cfg.layout == "tpu" else shape, dtype)


def _to_bnhvk(cfg, x):
    return jnp.swapaxes(x, 1, 2) if cfg.layout == "tpu" else x


def scan_forward(cfg, q, k, v, qk, G, S0T, *, store=False):
    """o [B, T, H, V] (v's dtype), S_N^T [B, H, V, K] fp32, and with ``store`` S_n^T for every
    chunk [B, N, H, V, K] (k's dtype) from [B, T, H, X] inputs (T a multiple of the chunk),
    QK [B, T, H, C], G [B, T, H, K] fp32 and S_0^T [B, H, V, K] fp32. With q and qk None (and
    ``store``) the kernel walks the state alone and o is None (``chunk_outputs`` forms it)."""
    B, T, H, K = k.shape
    V, C = v.shape[-1], cfg.chunk
    outputs = q is not None
    if not (outputs or store):
        raise ValueError("scan_forward without q (no outputs) must store the chunk states")
    N, s = T // C, scan_specs(cfg, B, H, T, K, V, transposed=True)
    tpu = cfg.layout == "tpu"
    out_shape = [jax.ShapeDtypeStruct((B, H, V, K), f32)]
    outs = [s["state"]]
    if outputs:
        out_shape.insert(0, jax.ShapeDtypeStruct((B, H, T, V) if tpu else (B, T, H, V), v.dtype))
        outs.insert(0, s["seq_v"])
    if store:
        out_shape.append(_chunk_states(cfg, (B, N, H, V, K), k.dtype))
        outs.append(s["chunks"])
    if tpu:
        from jax.experimental.pallas import tpu as pltpu

        kernel = functools.partial(_fwd_grid, n_chunks=N, store=store)
        scratch = {"scratch_shapes": [pltpu.VMEM((cfg.block_v, K), f32)]}
    else:
        kernel, scratch = functools.partial(_fwd_loop, n_chunks=N, chunk=C), {}
    ins = [(q, s["seq"](K)), (k, s["seq"](K)), (v, s["seq_v"]), (qk, s["seq"](C)), (G, s["seq"](K))]
    res = pl.pallas_call(
        with_absent(kernel, [x is not None for x, _ in ins] + [True, outputs]),
        grid=s["grid"],
        in_specs=[sp for x, sp in ins if x is not None] + [s["state"]],
        out_specs=outs,
        out_shape=out_shape,
        interpret=cfg.interpret,
        name="gla_scan_fwd",
        **scratch,
        **compiler_params(cfg),
    )(*_per_token(cfg, [x for x, _ in ins if x is not None]), S0T)
    res = list(res)
    o = _per_token(cfg, [res.pop(0)])[0] if outputs else None
    return (o, res[0]) + ((_to_bnhvk(cfg, res[1]),) if store else ())


def scan_backward(cfg, q, G, do, dSNT):
    """dS_{n+1}^T for every chunk [B, N, H, V, K] (fp32) and dS_0^T [B, H, V, K] from the
    cotangents do [B, T, H, V] and dS_N^T [B, H, V, K]."""
    B, T, H, K = q.shape
    V, C = do.shape[-1], cfg.chunk
    N, s = T // C, scan_specs(cfg, B, H, T, K, V, reverse=True, transposed=True)
    if cfg.layout == "tpu":
        from jax.experimental.pallas import tpu as pltpu

        kernel = functools.partial(_bwd_grid, n_chunks=N)
        scratch = {"scratch_shapes": [pltpu.VMEM((cfg.block_v, K), f32)]}
    else:
        kernel, scratch = functools.partial(_bwd_loop, n_chunks=N, chunk=C), {}
    dh, dS0 = pl.pallas_call(
        kernel,
        grid=s["grid"],
        in_specs=[s["seq"](K), s["seq"](K), s["seq_v"], s["state"]],
        out_specs=[s["chunks"], s["state"]],
        out_shape=[
            _chunk_states(cfg, (B, N, H, V, K), f32),
            jax.ShapeDtypeStruct((B, H, V, K), f32),
        ],
        interpret=cfg.interpret,
        name="gla_scan_bwd",
        **scratch,
        **compiler_params(cfg),
    )(*_per_token(cfg, (q, G, do)), dSNT)
    return _to_bnhvk(cfg, dh), dS0


def chunk_outputs(cfg, q, qk, G, hT, v):
    """o [B, T, H, V] (v's dtype) per chunk, in parallel, from the stored S_n^T (hT [B, N, H, V,
    K])."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    (o,) = chunk_call(
        cfg,
        functools.partial(_outputs_kernel, blk=cfg.chunk_block),
        [(q, K), (qk, cfg.chunk), (G, K), (hT, None), (v, V)],
        [(V, v.dtype)],
        (B, T, H),
        name="gla_scan_out",
    )
    return o


def state_grads(cfg, q, k, G, hT, dhT, v, qk, do, dv_dtype):
    """Per chunk, in parallel: dq, dk, dG (fp32) through the state, dv (in ``dv_dtype``: both
    of its paths) and dQK (fp32, lower triangle: the cotangent of the intra-chunk scores) from
    S_n^T (hT) and dS_{n+1}^T (dhT)."""
    B, T, H, K = q.shape
    V, C, blk = v.shape[-1], cfg.chunk, cfg.chunk_block
    dq, dk, dqk, dG = chunk_call(
        cfg,
        functools.partial(_state_grads_kernel, blk=blk),
        [(q, K), (k, K), (G, K), (hT, None), (dhT, None), (v, V), (do, V)],
        [(K, f32), (K, f32), (C, f32), (K, f32)],
        (B, T, H),
        name="gla_state_grads",
    )
    (dv,) = chunk_call(
        cfg,
        functools.partial(_values_grad_kernel, blk=blk),
        [(k, K), (qk, C), (G, K), (dhT, None), (do, V)],
        [(V, dv_dtype)],
        (B, T, H),
        name="gla_values_grad",
    )
    return dq, dk, dv, dG, dqk


# ---------------------------------------------------------------- the op


def _op(cfg, scale):
    """The custom_vjp op on padded inputs: (q, k, v, g [B, T, H, K], S0^T) -> (o, S_N^T)."""

    def states(kc, vc, G, S0T):
        return scan_forward(cfg, None, kc, vc, None, G, S0T, store=True)[1:]

    def scored(q, k, v, g):
        """The prepared inputs, G (g's chunk-local cumulative sum, fp32) and the intra-chunk
        scores QK (compute dtype)."""
        qs, kc, vc = cast_inputs(q, k, v, scale)
        G = chunk_local_cumsum_pallas(cfg, g)
        return qs, kc, vc, G, intra_scores(cfg, qs, kc, G)

    @jax.custom_vjp
    def op(q, k, v, g, S0T):
        qs, kc, vc, G, qk = scored(q, k, v, g)
        return scan_forward(cfg, qs, kc, vc, qk, G, S0T)

    def forward(q, k, v, g, S0T):
        qs, kc, vc, G, qk = scored(q, k, v, g)
        SNT, hT = states(kc, vc, G, S0T)
        o = chunk_outputs(cfg, qs, qk, G, hT, vc)
        saved = None if cfg.recompute else (hT, qk, G)
        return (o, SNT), (q, k, v, g, S0T, saved)

    def bwd(res, cts):
        q, k, v, g, S0T, saved = res
        do, dSNT = cts
        if saved is None:
            qs, kc, vc, G, qk = scored(q, k, v, g)
            hT = states(kc, vc, G, S0T)[1]
        else:
            (hT, qk, G), (qs, kc, vc) = saved, cast_inputs(q, k, v, scale)
        do = do.astype(qs.dtype)
        dhT, dS0T = scan_backward(cfg, qs, G, do, dSNT.astype(f32))
        dq, dk, dv, dG, dqk = state_grads(cfg, qs, kc, G, hT, dhT, vc, qk, do, v.dtype)
        dq, dk, dg = intra_grads(
            cfg, qs, kc, G, dqk, dq, dk, dG, scale=scale, dtypes=(q.dtype, k.dtype, g.dtype)
        )
        return dq, dk, dv, dg, dS0T

    op.defvjp(forward, bwd)
    return op


def decay_attention_per_key_pallas(
    q,
    k,
    v,
    g,
    *,
    scale=None,
    initial_state=None,
    output_final_state=False,
    settings: DecaySettings = DecaySettings(),
):
    """Same contract as ``decay_attention`` for a decay per key dimension (g [B, T, H,
    K]), as the kernels of the module docstring, launched as ``settings`` says."""
    B, T, H, K = q.shape
    if g.shape != (B, T, H, K):
        raise ValueError(
            f"decay_attention_per_key_pallas takes a decay per key "
            f"dimension, g [B, T, H, K] = {(B, T, H, K)}; got {g.shape}"
        )
    V = v.shape[-1]
    C = settings.chunk_size
    # num_stages None: 2, not the grid's rule of the scans with a decay per head (three
    # stages have not been timed on these kernels)
    stages = 2 if settings.num_stages is None else settings.num_stages
    cfg = kernel_config(
        settings,
        B,
        H,
        K,
        V,
        num_warps=settings.num_warps,
        num_stages=stages,
        chunk_warps=settings.chunk_warps,
        intra_block=settings.intra_block,
        recompute=settings.recompute,
    )
    scale = K**-0.5 if scale is None else float(scale)
    pad = (-T) % C
    S0T = (
        jnp.zeros((B, H, V, K), f32)
        if initial_state is None
        else jnp.swapaxes(initial_state.astype(f32), -1, -2)
    )
    o, SNT = _op(cfg, scale)(*(pad_time(x, pad) for x in (q, k, v, g)), S0T)
    return o[:, :T].astype(v.dtype), (jnp.swapaxes(SNT, -1, -2) if output_final_state else None)
