"""Chunked Gated DeltaNet as Pallas kernels: ``gated_delta_rule(impl="pallas")``.

Six kernels under one ``jax.custom_vjp`` (notation of ``chunk_reference.py``):
  forward   ``wy_kernels.wy_forward``        per chunk: X = (I + A)^-1, then w, u, QK.
            ``linear_scan.scan_forward``     sequential over chunks: v, o and the state (under
                                             differentiation also storing S_n and v per chunk).
  backward  ``linear_scan.scan_backward``    sequential, backwards: dv and dS_{n+1} per chunk, dS_0.
            ``linear_scan.state_grads``      per chunk: dq (whole), dk, dw, dG through the
                                             state and the intra-chunk scores QK.
            ``wy_kernels.wy_backward``       per chunk: adds dk, dG through the WY form; dv,
                                             dbeta.
Saved between the passes: the inputs, the initial state, X, w, QK, the chunk states S_n and the
corrected values v (in the inputs' dtype: 640 bytes per token and head at K = V = 64 in bf16).
With ``GDNSettings.recompute`` only X is saved and the backward recomputes w, QK
(``wy_forward`` given X) and S_n, v (``scan_forward(store=True)``), as fla does: 128 bytes per
token and head, two kernels more (docs/benchmarks.md compares the two). The kernels take q
unscaled and fold its scale into QK, into q's decay e^G and into the gradients' products (no XLA
pass over q). Padding T to the chunk, the chunk-local cumulative sum of g and its transpose are
XLA. Memory is O(T). With g None (DeltaNet: no decay) the same kernels run without G: no
exponentials, no dG.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from kernels_pallas import dispatch
from kernels_pallas.gdn import wy_apply_mosaic, wy_kernels
from kernels_pallas.gdn.settings import GDNSettings
from kernels_pallas.linear_scan import scan as scan_kernels
from kernels_pallas.linear_scan.common import (
    chunk_local_cumsum,
    kernel_config,
    pad_time,
    reverse_chunk_cumsum,
)

f32 = jnp.float32

# Each kernel function as a nested jit (config static): JAX lowers a jitted callee once per
# distinct (config, shapes) within a program, and lowering a pallas_call is where Triton compiles
# it, so the GDN layers of a model that share a shape share one compilation of each kernel.
_jit = lambda fn, *names: jax.jit(fn, static_argnums=0, static_argnames=names)
wy_forward = _jit(wy_kernels.wy_forward, "sub", "q_scale")
wy_backward = _jit(wy_kernels.wy_backward, "out_dtypes")
scan_forward = _jit(scan_kernels.scan_forward, "store", "q_scale")
scan_backward = _jit(scan_kernels.scan_backward, "q_scale")
state_grads = _jit(scan_kernels.state_grads, "q_scale", "dq_dtype")


def _op(cfg, scale):
    """The custom_vjp op on padded inputs: (q, k, v, g, beta, S0) -> (o, S_N); g None: no
    decay (DeltaNet), the kernels then without exponentials and without dG."""
    C = cfg.chunk

    def prepare(q, k, v, g, beta):
        """Inputs in the kernels' dtypes (q unscaled: every kernel folds the scale in)."""
        cd = jnp.result_type(q.dtype, k.dtype, v.dtype)
        G = None if g is None else chunk_local_cumsum(g.astype(f32), C)
        return q.astype(cd), k.astype(cd), v.astype(cd), beta.astype(f32), G

    def primal(q, k, v, g, beta, S0, store):
        qc, kc, vc, b, G = prepare(q, k, v, g, beta)
        w, u, qk, X = wy_forward(cfg, qc, kc, vc, b, G, q_scale=scale)
        outs = scan_forward(cfg, qc, kc, w, u, qk, G, S0, store=store, q_scale=scale)
        return outs, (w, qk, X)

    @jax.custom_vjp
    def op(q, k, v, g, beta, S0):
        return primal(q, k, v, g, beta, S0, False)[0]

    def forward(q, k, v, g, beta, S0):
        store = not cfg.recompute
        outs, (w, qk, X) = primal(q, k, v, g, beta, S0, store)
        saved = (w, qk) + tuple(outs[2:]) if store else ()  # w, QK, S_n, v
        return tuple(outs[:2]), (q, k, v, g, beta, S0, X, saved)

    def bwd(res, cts):
        q, k, v, g, beta, S0, X, saved = res
        do, dSN = cts
        qc, kc, vc, b, G = prepare(q, k, v, g, beta)
        cd = qc.dtype
        if saved:
            w, qk, h, v_new = saved
        else:
            w, u, qk, _ = wy_forward(cfg, qc, kc, vc, b, G, X, q_scale=scale)
            _, _, h, v_new = scan_forward(
                cfg,
                None,
                kc,
                w,
                u,
                None,
                G,
                S0,  # no o needed
                store=True,
            )
        dv_new, dh, dS0 = scan_backward(
            cfg, qc, kc, w, qk, G, do.astype(cd), dSN.astype(f32), q_scale=scale
        )
        dq, dk, dw, dG = state_grads(
            cfg, qc, kc, G, h, dh, v_new, dv_new, do.astype(cd), q_scale=scale, dq_dtype=q.dtype
        )
        dk, dv, db, dG = wy_backward(
            cfg, kc, vc, b, G, X, dw, dv_new.astype(cd), dk, dG, out_dtypes=(k.dtype, v.dtype)
        )
        dg = None if g is None else reverse_chunk_cumsum(dG, C).astype(g.dtype)
        return dq, dk, dv, dg, db.astype(beta.dtype), dS0

    op.defvjp(forward, bwd)
    return op


def wy_apply(settings: GDNSettings, K, V, dtype) -> str:
    """``settings.wy_apply``, "auto" resolved: the Mosaic GPU kernel where it runs compiled (a
    Hopper GPU in this process, shapes it takes), the Triton one elsewhere; logged once."""
    if settings.wy_apply != "auto":
        return settings.wy_apply
    mosaic = (
        settings.target() == "gpu"
        and settings.interpret is False
        and wy_apply_mosaic.hopper()
        and wy_apply_mosaic.takes(K, V, settings.chunk_size, dtype)
    )
    return dispatch.record(
        settings, "mosaic" if mosaic else "triton", op="gated_delta_rule.wy_apply"
    )


def gated_delta_rule_pallas(
    q,
    k,
    v,
    g,
    beta,
    *,
    scale=None,
    initial_state=None,
    output_final_state=False,
    settings: GDNSettings = GDNSettings(),
):
    """Same contract as ``gated_delta_rule``, as the kernels of the module docstring, launched
    as ``settings`` says (its ``impl`` is not read)."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    C = settings.chunk_size
    cd = jnp.result_type(q.dtype, k.dtype, v.dtype)
    cfg = kernel_config(
        settings,
        B,
        H,
        K,
        V,
        num_warps=settings.num_warps,
        num_stages=settings.num_stages,
        chunk_warps=settings.chunk_warps,
        inverse_warps=settings.inverse_warps,
        fp32_dots=settings.fp32_dots,
        recompute=settings.recompute,
        wy_apply=wy_apply(settings, K, V, cd),
    )
    if cfg.wy_apply == "mosaic":
        if cfg.layout != "triton":
            raise ValueError(
                "gated_delta_rule(wy_apply='mosaic') is a GPU kernel: no TPU "
                "layout; use wy_apply='triton' with pltpu.InterpretParams"
            )
        wy_apply_mosaic.check_shapes(K, V, C, cd)
    scale = K**-0.5 if scale is None else float(scale)
    pad = (-T) % C
    S0 = jnp.zeros((B, H, K, V), f32) if initial_state is None else initial_state.astype(f32)
    o, S = _op(cfg, scale)(
        *(None if x is None else pad_time(x, pad) for x in (q, k, v, g, beta)), S0
    )
    return o[:, :T].astype(v.dtype), (S if output_final_state else None)
