"""Gated DeltaNet ops: ``gated_delta_rule`` (training / prefill) and ``gated_delta_rule_step``.

Implementations:
  recurrent        ``naive.py``: lax.scan over tokens, the specification.
  chunk_reference  ``chunk_reference.py``: chunked WY/UT form in pure jnp, lax.scan over chunks.
  pallas           ``pallas.py``: the chunked form as Pallas kernels, forward and backward
                   (``wy_kernels.py`` per chunk, ``scan_kernels.py`` across chunks): Triton on
                   GPU, Mosaic on TPU, ``interpret=`` on CPU.
``impl="auto"`` picks per backend (``AUTO_IMPL``); ``kernels_pallas.dispatch.chosen()`` tells.
"""
from __future__ import annotations

from kernels_pallas import dispatch, sharding
from kernels_pallas.gdn.chunk_reference import gated_delta_rule_chunk_reference
from kernels_pallas.gdn.naive import gated_delta_rule_recurrent, gated_delta_rule_step
from kernels_pallas.gdn.pallas import gated_delta_rule_pallas

IMPLS = ("auto", "recurrent", "chunk_reference", "pallas")
AUTO_IMPL = {"cpu": "chunk_reference", "gpu": "pallas", "tpu": "pallas"}


def resolve_impl(impl: str = "auto") -> str:
    """The implementation ``gated_delta_rule(impl=impl)`` runs on this backend."""
    dispatch.check_impl("gated_delta_rule", impl, IMPLS)
    return AUTO_IMPL.get(dispatch.backend(), "chunk_reference") if impl == "auto" else impl


def _check_shapes(q, k, v, g, beta, initial_state, chunk_size):
    if q.ndim != 4:
        raise ValueError(f"gated_delta_rule: q must be [B,T,H,K], got shape {q.shape}")
    B, T, H, K = q.shape
    if k.shape != q.shape:
        raise ValueError(f"gated_delta_rule: k shape {k.shape} != q shape {q.shape}")
    if v.ndim != 4 or v.shape[:3] != (B, T, H):
        raise ValueError(f"gated_delta_rule: v must be [B={B},T={T},H={H},V], got {v.shape}")
    for name, x in (("g", g), ("beta", beta)):
        if x.shape != (B, T, H):
            raise ValueError(f"gated_delta_rule: {name} must be [B,T,H]={(B, T, H)}, got {x.shape}")
    if initial_state is not None and initial_state.shape != (B, H, K, v.shape[-1]):
        raise ValueError(f"gated_delta_rule: initial_state must be [B,H,K,V]="
                         f"{(B, H, K, v.shape[-1])}, got {initial_state.shape}")
    if chunk_size < 1:
        raise ValueError(f"gated_delta_rule: chunk_size must be >= 1, got {chunk_size}")


def gated_delta_rule(q, k, v, g, beta, *, scale=None, initial_state=None,
                     output_final_state=False, impl="auto", chunk_size=64, interpret=False):
    """Gated delta rule over a sequence, fla layout.

    Args:
      q, k: [B, T, H, K] (k L2-normalised by the caller); v: [B, T, H, V];
      g: [B, T, H] log decay (<= 0); beta: [B, T, H] in [0, 1];
      scale: query scale, default K**-0.5; initial_state: [B, H, K, V] (fp32);
      output_final_state: also return the state after the last token;
      impl: "auto" | "recurrent" | "chunk_reference" | "pallas"; chunk_size: C of the chunked
        forms; interpret: for "pallas" off its GPU/TPU: True (generic interpreter) or a
        ``pltpu.InterpretParams()`` (TPU semantics).
    Returns:
      (o [B, T, H, V] in v's dtype, final state [B, H, K, V] fp32 or None).
    """
    _check_shapes(q, k, v, g, beta, initial_state, chunk_size)
    impl = dispatch.record("gated_delta_rule", resolve_impl(impl))
    kw = dict(scale=scale, initial_state=initial_state, output_final_state=output_final_state)
    if impl == "recurrent":
        return gated_delta_rule_recurrent(q, k, v, g, beta, **kw)
    if impl == "pallas":
        km = sharding.current()
        if km is not None:
            return _pallas_per_shard(km, q, k, v, g, beta, chunk_size=chunk_size,
                                     interpret=interpret, **kw)
        return gated_delta_rule_pallas(q, k, v, g, beta, chunk_size=chunk_size,
                                       interpret=interpret, **kw)
    return gated_delta_rule_chunk_reference(q, k, v, g, beta, chunk_size=chunk_size, **kw)


def _pallas_per_shard(km, q, k, v, g, beta, *, initial_state, output_final_state, **kw):
    """The Pallas kernels on each device's rows and heads (``kernels_pallas.sharding``)."""
    b, h = km.batch_spec(q.shape[0]), km.head_spec(q.shape[2])
    x4, x3, st = sharding.P(b, None, h, None), sharding.P(b, None, h), sharding.P(b, h, None, None)
    args, specs = [q, k, v, g, beta], [x4, x4, x4, x3, x3]
    if initial_state is not None:
        args.append(initial_state)
        specs.append(st)

    def local(q, k, v, g, beta, h0=None):
        o, s = gated_delta_rule_pallas(q, k, v, g, beta, initial_state=h0,
                                       output_final_state=output_final_state, **kw)
        return (o, s) if output_final_state else o

    out = sharding.per_shard(local, km, tuple(specs), (x4, st) if output_final_state else x4)(
        *args)
    return out if output_final_state else (out, None)


__all__ = ["gated_delta_rule", "gated_delta_rule_step", "gated_delta_rule_recurrent",
           "gated_delta_rule_chunk_reference", "gated_delta_rule_pallas", "resolve_impl", "IMPLS",
           "AUTO_IMPL"]
