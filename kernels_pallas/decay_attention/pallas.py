"""Linear attention with a decay per head (Lightning, RetNet, Mamba-2) as Pallas kernels:
``gated_linear_attention(impl="pallas")``.

The chunked form of ``chunk_reference.py`` is the inter-chunk scan of ``kernels_pallas.
linear_scan`` with no delta rule (``w=None``: w = 0, u = v, neither read nor multiplied). Per
chunk of C tokens, with G the chunk-local cumulative log decay and E_ij = exp(G_i - G_j) for
j <= i (0 above the diagonal, masked before ``exp``, so every exponent is <= 0):

    QK      = (q k^T) * E                                    per chunk, XLA ([C, C] matmuls)
    forward   ``linear_scan.scan_forward``:  the states S_{n+1} = e^{G_last} S_n +
                                             (k e^{G_last - G})^T v_n, storing S_n (under
                                             differentiation; else fused with o);
              ``linear_scan.chunk_outputs``: o_n = (q e^G) S_n + QK_n v_n, per chunk;
    backward  ``linear_scan.scan_backward``: dS_{n+1} per chunk, dS_0;
              ``linear_scan.state_grads``:   dq, dk, dv, dQK, dG through the state;
              then through QK in XLA: dq += (dQK * E) k, dk += (dQK * E)^T q (products in
              the compute dtype, fp32 sums),
              dG += row sums - column sums of dQK * QK; dg = the chunk's reverse cumsum of dG.

Under one ``jax.custom_vjp``; saved between the passes: the inputs, QK, the chunk states S_n
(``DecaySettings.recompute``: the inputs only, the forward scan rerun in the backward). A
decay per key dimension (GLA, HGRN-2) does not factor into one E per chunk: its kernels are
``pallas_per_key.py``.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from kernels_pallas.decay_attention.settings import DecaySettings
from kernels_pallas.linear_scan import scan as scan_kernels
from kernels_pallas.linear_scan.common import (chunk_local_cumsum, chunked, kernel_config,
                                               pad_time, reverse_chunk_cumsum)

f32 = jnp.float32
_HI = jax.lax.Precision.HIGHEST

# nested jits (config static): one lowering, hence one Triton compilation, per shape and config
_jit = lambda fn, *names: jax.jit(fn, static_argnums=0, static_argnames=names)  # noqa: E731
scan_forward = _jit(scan_kernels.scan_forward, "store")
scan_backward = _jit(scan_kernels.scan_backward)
state_grads = _jit(scan_kernels.state_grads)
chunk_outputs = _jit(scan_kernels.chunk_outputs, "dtype")


def _decay_matrix(G, C):
    """E [B, N, H, C, C] fp32: exp(G_i - G_j) for j <= i, else 0."""
    B, T, H = G.shape
    Gc = G.reshape(B, T // C, C, H).transpose(0, 1, 3, 2)
    causal = jnp.tril(jnp.ones((C, C), bool))
    diff = jnp.where(causal, Gc[..., :, None] - Gc[..., None, :], 0.0)
    return jnp.where(causal, jnp.exp(diff), 0.0)


def _scores(qs, k, E, C):
    """q k^T per chunk [B, N, H, C, C] fp32, and QK = that * E laid out [B, T, H, C]."""
    s = jnp.einsum("bnhik,bnhjk->bnhij", chunked(qs, C), chunked(k, C),
                   preferred_element_type=f32)
    qk = s * E
    B, N, H = qk.shape[:3]
    return s, qk.transpose(0, 1, 3, 2, 4).reshape(B, N * C, H, C)


def prepare(q, k, v, g, C, scale):
    """q * scale, k, v in their common compute dtype, and G, the chunk-local cumulative sum of
    g (fp32; a decay per head or per key)."""
    cd = jnp.result_type(q.dtype, k.dtype, v.dtype)
    qs = q.astype(cd) if scale == 1.0 else (q.astype(f32) * scale).astype(cd)
    return qs, k.astype(cd), v.astype(cd), chunk_local_cumsum(g.astype(f32), C)


def _op(cfg, scale):
    """The custom_vjp op on padded inputs: (q, k, v, g [B, T, H], S0) -> (o, S_N)."""
    C = cfg.chunk

    def primal(q, k, v, g, S0, store):
        qs, kc, vc, G = prepare(q, k, v, g, C, scale)
        _, qk = _scores(qs, kc, _decay_matrix(G, C), C)
        qk = qk.astype(qs.dtype)
        if not store:
            return scan_forward(cfg, qs, kc, None, vc, qk, G, S0), qk
        _, sN, h = scan_forward(cfg, None, kc, None, vc, None, G, S0, store=True)
        return (chunk_outputs(cfg, qs, qk, G, h, vc, dtype=vc.dtype), sN, h), qk

    @jax.custom_vjp
    def op(q, k, v, g, S0):
        return primal(q, k, v, g, S0, False)[0]

    def forward(q, k, v, g, S0):
        store = not cfg.recompute
        outs, qk = primal(q, k, v, g, S0, store)
        saved = (qk, outs[2]) if store else ()                  # QK, S_n
        return tuple(outs[:2]), (q, k, v, g, S0, saved)

    def bwd(res, cts):
        q, k, v, g, S0, saved = res
        do, dSN = cts
        qs, kc, vc, G = prepare(q, k, v, g, C, scale)
        cd = qs.dtype
        E = _decay_matrix(G, C)
        s, qk = _scores(qs, kc, E, C)
        if saved:
            qk_in, h = saved
        else:
            qk_in = qk.astype(cd)
            h = scan_forward(cfg, None, kc, None, vc, None, G, S0, store=True)[2]
        _, dh, dS0 = scan_backward(cfg, qs, None, None, None, G, do.astype(cd), dSN.astype(f32))
        dq, dk, _, dv, dqk, dG = state_grads(cfg, qs, kc, G, h, dh, vc, None, do.astype(cd),
                                             qk=qk_in)
        dqk = chunked(dqk.astype(f32), C)                        # [B, N, H, C(i), C(j)]
        ds = dqk * E                                             # d(q k^T)
        B, T, H, K = q.shape
        unchunk = lambda x: x.transpose(0, 1, 3, 2, 4).reshape(B, T, H, -1)  # noqa: E731
        # products in the compute dtype (bf16: tensor cores), sums in fp32
        ds_c, prec = ds.astype(cd), (_HI if cd == f32 else None)
        dq = dq + unchunk(jnp.einsum("bnhij,bnhjk->bnhik", ds_c, chunked(kc, C), precision=prec,
                                     preferred_element_type=f32))
        dk = dk + unchunk(jnp.einsum("bnhij,bnhik->bnhjk", ds_c, chunked(qs, C), precision=prec,
                                     preferred_element_type=f32))
        p = dqk * s * E                                          # dQK * QK
        dG = dG + (p.sum(-1) - p.sum(-2)).transpose(0, 1, 3, 2).reshape(B, T, H)
        dg = reverse_chunk_cumsum(dG, C)
        return ((dq * scale).astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype),
                dg.astype(g.dtype), dS0)

    op.defvjp(forward, bwd)
    return op


def gated_linear_attention_pallas(q, k, v, g, *, scale=None, initial_state=None,
                                  output_final_state=False,
                                  settings: DecaySettings = DecaySettings()):
    """Same contract as ``gated_linear_attention`` for a decay per head (g [B, T, H]), as the
    kernels of the module docstring, launched as ``settings`` says (its ``impl`` is not read)."""
    if g.ndim != 3:
        raise ValueError(f"gated_linear_attention_pallas takes a decay per head, g [B, T, H]; "
                         f"got g of shape {g.shape} (a decay per key dimension: "
                         f"gated_linear_attention_per_key_pallas)")
    B, T, H, K = q.shape
    V = v.shape[-1]
    C = settings.chunk_size
    cfg = kernel_config(settings, B, H, K, V, num_warps=settings.num_warps,
                        num_stages=settings.num_stages, chunk_warps=settings.chunk_warps,
                        recompute=settings.recompute)
    scale = K ** -0.5 if scale is None else float(scale)
    pad = (-T) % C
    S0 = (jnp.zeros((B, H, K, V), f32) if initial_state is None
          else initial_state.astype(f32))
    o, S = _op(cfg, scale)(*(pad_time(x, pad) for x in (q, k, v, g)), S0)
    return o[:, :T].astype(v.dtype), (S if output_final_state else None)
