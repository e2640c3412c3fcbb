"""Linear attention with a decay per key dimension (GLA, HGRN-2) as Pallas kernels:
``gated_linear_attention(impl="pallas")`` with g [B, T, H, K].

Per chunk of C tokens, with G [C, K] the chunk-local cumulative log decay (per key), qd =
q e^G, kd = k e^{G_last - G} and a = e^{G_last} [K] (every exponent <= 0):

    o_n     = qd S_n + QK_n v_n,   QK_ij = sum_k q_ik k_jk e^{G_ik - G_jk}  (j <= i)
    S_{n+1} = diag(a) S_n + kd^T v_n

The decay scales the state's rows (one per key). The scan kernels therefore carry the state
transposed, S^T [BV, K] per program: the decay is then a broadcast along rows, as the scalar
decay is, and every product is a plain or transposed matmul (o = qd (S^T)^T, S^T += v^T kd).

  QK        per chunk, ``intra_key.intra_scores``: Pallas kernels, stable for any decay
    forward   ``_fwd`` kernel: o and S_N (and S_n per chunk for the backward)
    backward  ``_bwd`` kernel: dS_{n+1} per chunk and dS_0, walking the chunks down:
              dS_n = diag(a) dS_{n+1} + qd^T do_n;
              then every other gradient is chunk-parallel: the vjp (XLA autodiff, through QK by
              its own backward kernel) of the map (q, k, v, g) -> (o_n, S_{n+1}) with S_n held
              fixed, at the cotangents (do, dS_{n+1})

Under one ``jax.custom_vjp``; saved between the passes: the inputs, QK and the chunk states S_n
(``DecaySettings.recompute``: the inputs only, the forward scan rerun in the backward). Layouts
as ``kernels_pallas.linear_scan``: "triton" (grid (B, H, V/BV), a ``fori_loop`` over chunks)
and "tpu" (grid (B, H, V/BV, N), the state in VMEM scratch, [B, H, T, X] arrays).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from kernels_pallas.decay_attention.intra_key import intra_scores, known_scores
from kernels_pallas.decay_attention.pallas import prepare
from kernels_pallas.decay_attention.settings import DecaySettings
from kernels_pallas.linear_scan.common import (chunked, compiler_params, dot, dot_nt, f32,
                                               kernel_config, pad_time, scan_specs)

_HI = jax.lax.Precision.HIGHEST


# ---------------------------------------------------------------- per-chunk bodies (values)

def _decays(G):
    """e^G, e^{G_last - G} [C, K] and e^{G_last} [1, K] of a chunk's G [C, K] (fp32)."""
    last = jax.lax.broadcasted_iota(jnp.int32, G.shape, 0) == G.shape[0] - 1
    g_last = jnp.sum(jnp.where(last, G, 0.0), axis=0, keepdims=True)
    return jnp.exp(G), jnp.exp(g_last - G), jnp.exp(g_last)


def _fwd_chunk(ST, q, k, v, qk, G):
    eq, ek, a = _decays(G)
    qd = (q.astype(f32) * eq).astype(q.dtype)
    kd = (k.astype(f32) * ek).astype(k.dtype)
    o = dot_nt(qd, ST.astype(q.dtype)) + dot(qk, v)               # [C, BV]
    return o, a * ST + dot(v, kd, trans_a=True)                    # S^T [BV, K]


def _bwd_chunk(dST, q, G, do):
    eq, _, a = _decays(G)
    qd = (q.astype(f32) * eq).astype(q.dtype)
    return a * dST + dot(do, qd, trans_a=True)


# ---------------------------------------------------------------- kernels

def _fwd_loop(q_ref, k_ref, v_ref, qk_ref, g_ref, s0_ref, o_ref, sN_ref, *store, n_chunks,
              chunk):
    def body(n, ST):
        t = pl.ds(pl.multiple_of(n * chunk, chunk), chunk)
        if store:
            store[0][n, :, :] = ST.astype(store[0].dtype)
        o, ST = _fwd_chunk(ST, q_ref[t, :], k_ref[t, :], v_ref[t, :], qk_ref[t, :], g_ref[t, :])
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
    o, ST = _fwd_chunk(ST, q_ref[...], k_ref[...], v_ref[...], qk_ref[...], g_ref[...])
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
    chunk [B, N, H, V, K] (q's dtype) from [B, T, H, X] inputs (T a multiple of the chunk),
    QK [B, T, H, C], G [B, T, H, K] fp32 and S_0^T [B, H, V, K] fp32."""
    B, T, H, K = q.shape
    V, C = v.shape[-1], cfg.chunk
    N, s = T // C, scan_specs(cfg, B, H, T, K, V, transposed=True)
    tpu = cfg.layout == "tpu"
    out_shape = [jax.ShapeDtypeStruct((B, H, T, V) if tpu else (B, T, H, V), v.dtype),
                 jax.ShapeDtypeStruct((B, H, V, K), f32)]
    outs = [s["seq_v"], s["state"]]
    if store:
        out_shape.append(_chunk_states(cfg, (B, N, H, V, K), q.dtype))
        outs.append(s["chunks"])
    if tpu:
        from jax.experimental.pallas import tpu as pltpu
        kernel = functools.partial(_fwd_grid, n_chunks=N, store=store)
        scratch = {"scratch_shapes": [pltpu.VMEM((cfg.block_v, K), f32)]}
    else:
        kernel, scratch = functools.partial(_fwd_loop, n_chunks=N, chunk=C), {}
    res = pl.pallas_call(
        kernel, grid=s["grid"],
        in_specs=[s["seq"](K), s["seq"](K), s["seq_v"], s["seq"](C), s["seq"](K), s["state"]],
        out_specs=outs, out_shape=out_shape, interpret=cfg.interpret,
        name="gla_scan_fwd", **scratch, **compiler_params(cfg),
    )(*_per_token(cfg, (q, k, v, qk, G)), S0T)
    o = _per_token(cfg, [res[0]])[0]
    return (o, res[1]) + ((_to_bnhvk(cfg, res[2]),) if store else ())


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
        kernel, grid=s["grid"],
        in_specs=[s["seq"](K), s["seq"](K), s["seq_v"], s["state"]],
        out_specs=[s["chunks"], s["state"]],
        out_shape=[_chunk_states(cfg, (B, N, H, V, K), f32),
                   jax.ShapeDtypeStruct((B, H, V, K), f32)],
        interpret=cfg.interpret, name="gla_scan_bwd", **scratch, **compiler_params(cfg),
    )(*_per_token(cfg, (q, G, do)), dSNT)
    return _to_bnhvk(cfg, dh), dS0


# ---------------------------------------------------------------- chunk-parallel parts (XLA)

def _chunk_outputs(cfg, q, k, v, g, hT, qk, scale):
    """Every chunk's (o_n, S_{n+1}) with the entering states S_n^T [B, N, H, V, K] and the
    intra-chunk scores QK [B, T, H, C] of the forward given: the map the backward differentiates
    (fp32; through QK by ``intra_key``'s backward kernel)."""
    C = cfg.chunk
    qs, kc, vc, G = (x.astype(f32) for x in prepare(q, k, v, g, C, scale))
    qk = chunked(known_scores(cfg, qs, kc, G, qk), C)                # [B, N, H, C, C]
    Qc, Kc, Vc, Gc = (chunked(x, C) for x in (qs, kc, vc, G))       # [B, N, H, C, X]
    g_last = Gc[..., -1:, :]
    hT = hT.astype(f32)
    o = (jnp.einsum("bnhij,bnhjv->bnhiv", qk, Vc, precision=_HI)
         + jnp.einsum("bnhck,bnhvk->bnhcv", Qc * jnp.exp(Gc), hT, precision=_HI))
    sT = jnp.exp(g_last) * hT + jnp.einsum("bnhcv,bnhck->bnhvk", Vc, Kc * jnp.exp(g_last - Gc),
                                           precision=_HI)
    return o, sT


def _op(cfg, scale):
    """The custom_vjp op on padded inputs: (q, k, v, g [B, T, H, K], S0^T) -> (o, S_N^T)."""
    C = cfg.chunk

    def primal(q, k, v, g, S0T, store):
        qs, kc, vc, G = prepare(q, k, v, g, C, scale)
        qk = intra_scores(cfg, qs, kc, G).astype(qs.dtype)
        return scan_forward(cfg, qs, kc, vc, qk, G, S0T, store=store), qk

    @jax.custom_vjp
    def op(q, k, v, g, S0T):
        return primal(q, k, v, g, S0T, False)[0]

    def forward(q, k, v, g, S0T):
        store = not cfg.recompute
        outs, qk = primal(q, k, v, g, S0T, store)
        return outs[:2], (q, k, v, g, S0T, (outs[2], qk) if store else None)

    def bwd(res, cts):
        q, k, v, g, S0T, saved = res
        do, dSNT = cts
        if saved is None:
            outs, qk = primal(q, k, v, g, S0T, True)
            saved = outs[2], qk
        hT, qk = saved
        qs, _, _, G = prepare(q, k, v, g, C, scale)
        dhT, dS0T = scan_backward(cfg, qs, G, do.astype(qs.dtype), dSNT.astype(f32))
        _, vjp = jax.vjp(lambda *a: _chunk_outputs(cfg, *a, hT, qk, scale), q, k, v, g)
        dq, dk, dv, dg = vjp((chunked(do.astype(f32), C), dhT))
        return (dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), dg.astype(g.dtype),
                dS0T)

    op.defvjp(forward, bwd)
    return op


def gated_linear_attention_per_key_pallas(q, k, v, g, *, scale=None, initial_state=None,
                                          output_final_state=False,
                                          settings: DecaySettings = DecaySettings()):
    """Same contract as ``gated_linear_attention`` for a decay per key dimension (g [B, T, H,
    K]), as the kernels of the module docstring, launched as ``settings`` says."""
    B, T, H, K = q.shape
    if g.shape != (B, T, H, K):
        raise ValueError(f"gated_linear_attention_per_key_pallas takes a decay per key "
                         f"dimension, g [B, T, H, K] = {(B, T, H, K)}; got {g.shape}")
    V = v.shape[-1]
    C = settings.chunk_size
    cfg = kernel_config(settings, B, H, K, V, num_warps=settings.num_warps,
                        num_stages=settings.num_stages, chunk_warps=settings.chunk_warps,
                        recompute=settings.recompute)
    scale = K ** -0.5 if scale is None else float(scale)
    pad = (-T) % C
    S0T = (jnp.zeros((B, H, V, K), f32) if initial_state is None
           else jnp.swapaxes(initial_state.astype(f32), -1, -2))
    o, SNT = _op(cfg, scale)(*(pad_time(x, pad) for x in (q, k, v, g)), S0T)
    return o[:, :T].astype(v.dtype), (jnp.swapaxes(SNT, -1, -2) if output_final_state else None)
