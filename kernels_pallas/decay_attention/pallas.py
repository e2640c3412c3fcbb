"""Linear attention with a decay per head (Lightning, RetNet, Mamba-2) as Pallas kernels:
``decay_attention(impl="pallas")``.

The chunked form of ``chunk_reference.py`` is the inter-chunk scan of ``kernels_pallas.
linear_scan`` with no delta rule (``w=None``: w = 0, u = v, neither read nor multiplied). Per
chunk of C tokens, with G the chunk-local cumulative log decay, E_ij = e^{G_i - G_j} for j <= i
(0 above the diagonal; every exponent <= 0), QK = (q k^T) * E, qd = q e^G and
kd = k e^{G_last - G}:

    forward   ``linear_scan.scan_forward``:  S_{n+1} = e^{G_last} S_n + kd^T v_n, sequential,
                                             storing S_n;
              ``chunk_outputs``:             o_n = qd S_n + QK_n v_n, per chunk (QK formed
                                             in the kernel, never written);
    backward  ``linear_scan.scan_backward``: dS_n = e^{G_last} dS_{n+1} + qd^T do_n, sequential;
              ``_state_path_kernel``, per chunk: dq = (do S_n^T) e^G,
                                             dk = (v dS_{n+1}^T) e^{G_last - G}, and the
                                             G_last term of dG (sum_c k.dk + e^{G_last}
                                             S_n.dS_{n+1}, on the last row);
              ``_score_path_kernel``, per chunk: dQK = do v^T, dS = dQK * E, dq += dS k,
                                             dk += dS^T q, dG = q.dq - k.dk + that term,
                                             dv = QK^T do + kd dS_{n+1};
              dg = the chunk's reverse cumsum of dG (XLA).

dG needs no sums over QK: every q_i enters the output with e^{G_i} and every k_j with e^{-G_j}
(both through QK and through the state), so dL/dG_i = q_i.dq_i - k_i.dk_i plus the terms of
G_last. Under one ``jax.custom_vjp``; saved between the passes: the inputs and the chunk states
S_n (``DecaySettings.recompute``: the inputs only, the state scan rerun in the backward). A
decay per key dimension (GLA, HGRN-2) does not factor into one E per chunk: its kernels are
``pallas_per_key.py``.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from kernels_pallas.decay_attention.settings import DecaySettings
from kernels_pallas.linear_scan import scan as scan_kernels
from kernels_pallas.linear_scan.chunk_math import (
    causal_decay,
    chunk_output,
    chunk_rows,
    decayed_scores,
    k_decayed,
    last_row,
)
from kernels_pallas.linear_scan.common import (
    chunk_call,
    chunk_local_cumsum,
    col_blocks,
    dot,
    dot_nt,
    kernel_config,
    pad_time,
    reverse_chunk_cumsum,
)

f32 = jnp.float32

# nested jits (config static): one lowering, hence one Triton compilation, per shape and config
_jit = lambda fn, *names: jax.jit(fn, static_argnums=0, static_argnames=names)
scan_forward = _jit(scan_kernels.scan_forward, "store")
scan_backward = _jit(scan_kernels.scan_backward)


def cast_inputs(q, k, v, scale):
    """q * scale, k, v in their common compute dtype."""
    cd = jnp.result_type(q.dtype, k.dtype, v.dtype)
    qs = q.astype(cd) if scale == 1.0 else (q.astype(f32) * scale).astype(cd)
    return qs, k.astype(cd), v.astype(cd)


def prepare(q, k, v, g, C, scale):
    """``cast_inputs`` and G, the chunk-local cumulative sum of g (fp32; a decay per head or
    per key)."""
    return (*cast_inputs(q, k, v, scale), chunk_local_cumsum(g.astype(f32), C))


# ---------------------------------------------------------------- chunk-parallel forward


def _outputs_kernel(q_ref, k_ref, g_ref, gr_ref, h_ref, v_ref, o_ref, *, blk):
    """o = (q e^G) S_n + QK v of one chunk, QK = (q k^T) * E formed here from G as a column
    (g_ref) and a row (gr_ref)."""
    cd = q_ref.dtype
    q, G = q_ref[...], g_ref[...]
    qk = decayed_scores(q, k_ref[...], G, gr_ref[...]).astype(cd)
    for cv in col_blocks(o_ref.shape[-1], blk):
        o = chunk_output(q, qk, G, h_ref[:, cv].astype(cd), v_ref[:, cv].astype(cd))
        o_ref[:, cv] = o.astype(o_ref.dtype)


def chunk_outputs(cfg, q, k, G, h, v, *, dtype):
    """Per chunk, in parallel, without the delta rule: o = (q e^G) S_n + QK v [B, T, H, V] in
    ``dtype``, from the chunk states S_n (h [B, N, H, K, V]) that ``scan_forward(q=None,
    store=True)`` stored; QK = (q k^T) * E, E_ij = e^{G_i - G_j} for j <= i, formed in the
    kernel (never written)."""
    B, T, H, K = q.shape
    V, C = v.shape[-1], cfg.chunk
    (o,) = chunk_call(
        cfg,
        functools.partial(_outputs_kernel, blk=cfg.chunk_block),
        [(q, K), (k, K), (G[..., None], 1), (chunk_rows(G, C), None), (h, None), (v, V)],
        [(V, dtype)],
        (B, T, H),
        name="linear_scan_out",
    )
    return o


_chunk_outputs = _jit(chunk_outputs, "dtype")


# ---------------------------------------------------------------- chunk-parallel backward


def _state_path_kernel(k_ref, g_ref, h_ref, dh_ref, v_ref, do_ref, dq_ref, dk_ref, dl_ref, *, blk):
    """One chunk's gradients through the state from S_n (h), dS_{n+1} (dh) [K, V]: dq =
    (do S_n^T) e^G, dk = (v dS_{n+1}^T) e^{G_last - G}, and the G_last term of dG on the last
    row (0 elsewhere); K and V in blocks of ``blk``."""
    C, K = k_ref.shape
    V = v_ref.shape[-1]
    cd = k_ref.dtype
    G = g_ref[...]
    last, g_last = last_row(G)
    hdh = jnp.zeros((1, 1), f32)
    k_dk = jnp.zeros((C, 1), f32)
    for ck in col_blocks(K, blk):
        dqd = jnp.zeros((C, ck.size), f32)
        dkd = jnp.zeros((C, ck.size), f32)
        for cv in col_blocks(V, blk):
            h, dh = h_ref[ck, cv], dh_ref[ck, cv]
            dqd += dot_nt(do_ref[:, cv], h.astype(cd))
            dkd += dot_nt(v_ref[:, cv], dh.astype(cd))
            hdh += jnp.sum(
                jnp.sum(h.astype(f32) * dh.astype(f32), axis=1, keepdims=True),
                axis=0,
                keepdims=True,
            )
        dk = dkd * jnp.exp(g_last - G)
        k_dk += jnp.sum(dk * k_ref[:, ck].astype(f32), axis=1, keepdims=True)
        dq_ref[:, ck] = (dqd * jnp.exp(G)).astype(dq_ref.dtype)
        dk_ref[:, ck] = dk.astype(dk_ref.dtype)
    d_last = jnp.sum(k_dk, axis=0, keepdims=True) + jnp.exp(g_last) * hdh
    dl_ref[...] = jnp.where(last, d_last, 0.0)


def _score_path_kernel(
    q_ref,
    k_ref,
    g_ref,
    gr_ref,
    dh_ref,
    v_ref,
    do_ref,
    dqs_ref,
    dks_ref,
    dl_ref,
    dq_ref,
    dk_ref,
    dv_ref,
    dg_ref,
    *,
    blk,
    scale,
):
    """One chunk: adds the path through QK to the state path's dq, dk (dqs, dks) and forms dG
    (q.dq - k.dk + the G_last term dl) and dv = QK^T do + kd dS_{n+1}; stores dq times
    ``scale`` (q here is the scaled query)."""
    C, K = k_ref.shape
    V = v_ref.shape[-1]
    cd = k_ref.dtype
    G = g_ref[...]
    E = causal_decay(G, gr_ref[...])
    dqk = jnp.zeros((C, C), f32)
    for cv in col_blocks(V, blk):
        dqk += dot_nt(do_ref[:, cv], v_ref[:, cv])
    ds = (dqk * E).astype(cd)
    from_q = jnp.zeros((C, 1), f32)
    from_k = jnp.zeros((C, 1), f32)
    for ck in col_blocks(K, blk):
        q, k = q_ref[:, ck], k_ref[:, ck]
        dq = dqs_ref[:, ck].astype(f32) + dot(ds, k)
        dk = dks_ref[:, ck].astype(f32) + dot(ds, q, trans_a=True)
        from_q += jnp.sum(dq * q.astype(f32), axis=1, keepdims=True)
        from_k += jnp.sum(dk * k.astype(f32), axis=1, keepdims=True)
        dq_ref[:, ck] = (dq * scale).astype(dq_ref.dtype)
        dk_ref[:, ck] = dk.astype(dk_ref.dtype)
    dg_ref[...] = from_q - from_k + dl_ref[...]
    k = k_ref[...]
    qk = (dot_nt(q_ref[...], k) * E).astype(cd)
    kd, _ = k_decayed(k, G)
    for cv in col_blocks(V, blk):
        dv = dot(qk, do_ref[:, cv], trans_a=True) + dot(kd, dh_ref[:, cv].astype(cd))
        dv_ref[:, cv] = dv.astype(dv_ref.dtype)


def chunk_grads(cfg, q, k, G, h, dh, v, do, *, scale, dtypes):
    """dq (times ``scale``), dk, dv in ``dtypes`` and dG (fp32) per chunk, in parallel, from
    S_n (h) and dS_{n+1} (dh) [B, N, H, K, V]: two kernels (the state path, then the path
    through QK), each within the registers that one of both would spill from. The state path's
    dq, dk pass between them in the compute dtype (halving that traffic; in bf16 a second
    rounding of the final bf16 gradients), every sum in fp32."""
    B, T, H, K = q.shape
    V, C, blk = v.shape[-1], cfg.chunk, cfg.chunk_block
    Gc = G[..., None]
    dqs, dks, dl = chunk_call(
        cfg,
        functools.partial(_state_path_kernel, blk=blk),
        [(k, K), (Gc, 1), (h, None), (dh, None), (v, V), (do, V)],
        [(K, k.dtype), (K, k.dtype), (1, f32)],
        (B, T, H),
        name="linear_state_grads",
    )
    dq, dk, dv, dG = chunk_call(
        cfg,
        functools.partial(_score_path_kernel, blk=blk, scale=scale),
        [
            (q, K),
            (k, K),
            (Gc, 1),
            (chunk_rows(G, C), None),
            (dh, None),
            (v, V),
            (do, V),
            (dqs, K),
            (dks, K),
            (dl, 1),
        ],
        [(K, dtypes[0]), (K, dtypes[1]), (V, dtypes[2]), (1, f32)],
        (B, T, H),
        name="linear_score_grads",
    )
    return dq, dk, dv, dG[..., 0]


_chunk_grads = _jit(chunk_grads, "scale", "dtypes")


# ---------------------------------------------------------------- the op


def _op(cfg, scale):
    """The custom_vjp op on padded inputs: (q, k, v, g [B, T, H], S0) -> (o, S_N)."""
    C = cfg.chunk

    def states(kc, vc, G, S0):
        return scan_forward(cfg, None, kc, None, vc, None, G, S0, store=True)[1:]

    def forward(q, k, v, g, S0):
        qs, kc, vc, G = prepare(q, k, v, g, C, scale)
        SN, h = states(kc, vc, G, S0)
        o = _chunk_outputs(cfg, qs, kc, G, h, vc, dtype=vc.dtype)
        return (o, SN), (q, k, v, g, S0, None if cfg.recompute else h)

    @jax.custom_vjp
    def op(q, k, v, g, S0):
        return forward(q, k, v, g, S0)[0]

    def bwd(res, cts):
        q, k, v, g, S0, h = res
        do, dSN = cts
        qs, kc, vc, G = prepare(q, k, v, g, C, scale)
        if h is None:
            h = states(kc, vc, G, S0)[1]
        do = do.astype(qs.dtype)
        _, dh, dS0 = scan_backward(cfg, qs, None, None, None, G, do, dSN.astype(f32))
        dq, dk, dv, dG = _chunk_grads(
            cfg, qs, kc, G, h, dh, vc, do, scale=scale, dtypes=(q.dtype, k.dtype, v.dtype)
        )
        return dq, dk, dv, reverse_chunk_cumsum(dG, C).astype(g.dtype), dS0

    op.defvjp(forward, bwd)
    return op


def decay_attention_pallas(
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
    """Same contract as ``decay_attention`` for a decay per head (g [B, T, H]), as the
    kernels of the module docstring, launched as ``settings`` says (its ``impl`` is not read)."""
    if g.ndim != 3:
        raise ValueError(
            f"decay_attention_pallas takes a decay per head, g [B, T, H]; "
            f"got g of shape {g.shape} (a decay per key dimension: "
            f"decay_attention_per_key_pallas)"
        )
    B, T, H, K = q.shape
    V = v.shape[-1]
    C = settings.chunk_size
    cfg = kernel_config(
        settings,
        B,
        H,
        K,
        V,
        num_warps=settings.num_warps,
        num_stages=settings.num_stages,
        chunk_warps=settings.chunk_warps,
        recompute=settings.recompute,
    )
    scale = K**-0.5 if scale is None else float(scale)
    pad = (-T) % C
    S0 = jnp.zeros((B, H, K, V), f32) if initial_state is None else initial_state.astype(f32)
    o, S = _op(cfg, scale)(*(pad_time(x, pad) for x in (q, k, v, g)), S0)
    return o[:, :T].astype(v.dtype), (S if output_final_state else None)
