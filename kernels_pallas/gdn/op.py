"""``gated_delta_rule`` and ``gated_delta_rule_step``: the public entries, which check shapes
and run the implementation their ``GDNSettings`` choose; under ``kernel_mesh`` the chunked
Pallas kernels run per device shard, and a mesh with a sequence axis splits the time dimension
(``sequence.py``)."""

from __future__ import annotations

import jax.numpy as jnp

from kernels_pallas import dispatch, sharding
from kernels_pallas.dispatch import pow2
from kernels_pallas.gdn import reference
from kernels_pallas.gdn.chunk_reference import gated_delta_rule_chunk_reference
from kernels_pallas.gdn.pallas import gated_delta_rule_pallas
from kernels_pallas.gdn.reference import gated_delta_rule_recurrent
from kernels_pallas.gdn.sequence import operands, over_shards
from kernels_pallas.gdn.settings import GDNSettings
from kernels_pallas.gdn.step import step_pallas


def _check_shapes(q, k, v, g, beta, initial_state):
    if q.ndim != 4:
        raise ValueError(f"gated_delta_rule: q must be [B,T,H,K], got shape {q.shape}")
    B, T, H, K = q.shape
    if k.shape != q.shape:
        raise ValueError(f"gated_delta_rule: k shape {k.shape} != q shape {q.shape}")
    if v.ndim != 4 or v.shape[:3] != (B, T, H):
        raise ValueError(f"gated_delta_rule: v must be [B={B},T={T},H={H},V], got {v.shape}")
    for name, x in (("g", g), ("beta", beta)):
        if x is not None and x.shape != (B, T, H):
            raise ValueError(f"gated_delta_rule: {name} must be [B,T,H]={(B, T, H)}, got {x.shape}")
    if initial_state is not None and initial_state.shape != (B, H, K, v.shape[-1]):
        raise ValueError(
            f"gated_delta_rule: initial_state must be [B,H,K,V]="
            f"{(B, H, K, v.shape[-1])}, got {initial_state.shape}"
        )


def gated_delta_rule(
    q,
    k,
    v,
    g,
    beta,
    *,
    scale=None,
    initial_state=None,
    output_final_state=False,
    settings: GDNSettings | None = None,
):
    """Gated delta rule over a sequence, fla layout.

    Args:
      q, k: [B, T, H, K] (k L2-normalised by the caller); v: [B, T, H, V];
      g: [B, T, H] log decay (<= 0), or None: no decay (DeltaNet; the Pallas kernels then
        skip every exponential and the decay's gradient); beta: [B, T, H] in [0, 1];
      scale: query scale, default K**-0.5; initial_state: [B, H, K, V] (fp32);
      output_final_state: also return the state after the last token;
      settings: which implementation and how it is launched (default ``GDNSettings()``).
    Returns:
      (o [B, T, H, V] in v's dtype, final state [B, H, K, V] fp32 or None).
    """
    settings = GDNSettings() if settings is None else settings
    _check_shapes(q, k, v, g, beta, initial_state)
    impl = dispatch.record(settings, settings.choose())
    kw = dict(scale=scale, initial_state=initial_state, output_final_state=output_final_state)
    if g is None and impl != "pallas":
        g = jnp.zeros(q.shape[:3], jnp.float32)
    km = sharding.current()
    axis = km.seq_spec(q.shape[1]) if km is not None else None
    if axis is not None:  # the time dimension split over a mesh axis
        if impl == "recurrent":
            scan, extra = gated_delta_rule_recurrent, {}
        elif impl == "chunk_reference":
            scan, extra = gated_delta_rule_chunk_reference, {"chunk_size": settings.chunk_size}
        else:
            scan, extra = gated_delta_rule_pallas, {"settings": settings}
        return over_shards(scan, km, axis, q, k, v, g, beta, **kw, **extra)
    if impl == "recurrent":
        return gated_delta_rule_recurrent(q, k, v, g, beta, **kw)
    if impl == "chunk_reference":
        return gated_delta_rule_chunk_reference(
            q, k, v, g, beta, chunk_size=settings.chunk_size, **kw
        )
    if km is None:
        return gated_delta_rule_pallas(q, k, v, g, beta, settings=settings, **kw)
    return _pallas_per_shard(km, q, k, v, g, beta, settings=settings, **kw)


def _pallas_per_shard(km, q, k, v, g, beta, *, initial_state, output_final_state, **kw):
    """The Pallas kernels on each device's rows and heads (``kernels_pallas.sharding``)."""
    names, args, specs, x4, st = operands(km, None, q, k, v, g, beta, initial_state)

    def local(*args):
        a = dict(zip(names, args))
        o, s = gated_delta_rule_pallas(
            a["q"],
            a["k"],
            a["v"],
            a.get("g"),
            a["beta"],
            initial_state=a.get("initial_state"),
            output_final_state=output_final_state,
            **kw,
        )
        return (o, s) if output_final_state else o

    out = sharding.per_shard(local, km, specs, (x4, st) if output_final_state else x4)(*args)
    return out if output_final_state else (out, None)


def gated_delta_rule_step(
    q_t, k_t, v_t, g_t, beta_t, state, *, scale=None, settings: GDNSettings | None = None
):
    """One decode step: q_t, k_t [B, H, K]; v_t [B, H, V]; g_t, beta_t [B, H]; state
    [B, H, K, V] fp32 -> (o_t [B, H, V] in v_t's dtype, new state fp32).

    ``settings.impl`` "pallas" ("auto" on a GPU) runs ``step.step_pallas`` (one kernel, the
    state read and written once) where K and V are powers of two, B x H is at least
    ``settings.step_min_programs`` and the target is a GPU (or ``interpret=True``); every
    other case the jnp step (``reference.py``), which XLA fuses. Under ``kernel_mesh`` the jnp
    step runs (XLA partitions it)."""
    settings = GDNSettings() if settings is None else settings
    B, H, K = q_t.shape
    V = v_t.shape[-1]
    if k_t.shape != q_t.shape or v_t.shape[:2] != (B, H) or state.shape != (B, H, K, V):
        raise ValueError(
            f"gated_delta_rule_step: q, k [B,H,K], v [B,H,V], state [B,H,K,V] "
            f"expected, got q {q_t.shape}, k {k_t.shape}, v {v_t.shape}, state "
            f"{state.shape}"
        )
    for name, x in (("g", g_t), ("beta", beta_t)):
        if x.shape != (B, H):
            raise ValueError(f"gated_delta_rule_step: {name} must be [B,H]={(B, H)}, got {x.shape}")
    scale = K**-0.5 if scale is None else scale
    kernel = (
        settings.choose() == "pallas"
        and pow2(K)
        and pow2(V)
        and B * H >= settings.step_min_programs
        and dispatch.triton_target(settings)
        and sharding.current() is None
    )
    dispatch.record(settings, "pallas" if kernel else "reference", op="gated_delta_rule_step")
    if kernel:
        return step_pallas(
            q_t,
            k_t,
            v_t,
            g_t,
            beta_t,
            state,
            scale=float(scale),
            interpret=settings.interpret,
            num_warps=settings.num_warps,
        )
    return reference.gated_delta_rule_step(q_t, k_t, v_t, g_t, beta_t, state, scale=scale)
