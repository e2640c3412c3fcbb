"""RMSNorm over the last axis, optionally fused with the residual add before it.

    rms_norm(x, w)            -> y = x / rms(x) * w                    (fp32 inside)
    rms_norm(x, w, delta=d)   -> (h, y) with h = x + d, y = rms_norm(h, w)

Implementations:
  reference  ``reference.py``: jnp with hand-written backwards (the specification; TPU, CPU).
  pallas     ``pallas.py``: one Triton kernel forward, one backward; GPU, or ``interpret=True``.
``impl="auto"`` picks per backend (``AUTO_IMPL``), and the reference where the kernels cannot
run (a width that is not a power of two).
"""
from __future__ import annotations

import jax.numpy as jnp

from kernels_pallas import dispatch, sharding
from kernels_pallas.rms_norm.pallas import rms_norm_pallas
from kernels_pallas.rms_norm.reference import (add_rms_norm_reference, norm_grads,
                                               rms_norm_reference, rms_stats)

IMPLS = ("auto", "reference", "pallas")
AUTO_IMPL = {"gpu": "pallas"}


def resolve_impl(impl: str = "auto", dim: int | None = None) -> str:
    """The implementation ``rms_norm(impl=impl)`` runs on this backend for rows of ``dim``."""
    dispatch.check_impl("rms_norm", impl, IMPLS)
    if impl != "auto":
        return impl
    choice = AUTO_IMPL.get(dispatch.backend(), "reference")
    if choice == "pallas" and dim is not None and (dim < 1 or dim & (dim - 1)):
        return "reference"
    return choice


def rms_norm(x, weight, delta=None, *, eps: float = 1e-6, dtype=None, impl: str = "auto",
             interpret=False):
    """y = x / sqrt(mean(x^2) + eps) * weight over the last axis, in fp32, cast to ``dtype``
    (default x's). With ``delta`` (x's shape): returns (h, rms_norm(h)) with h = x + delta in
    x's dtype, the residual stream's add fused with the norm after it."""
    if weight.shape != x.shape[-1:]:
        raise ValueError(f"rms_norm: weight must be [{x.shape[-1]}], got {weight.shape}")
    if delta is not None:
        if delta.shape != x.shape:
            raise ValueError(f"rms_norm: delta must have x's shape {x.shape}, got {delta.shape}")
        delta = delta.astype(x.dtype)
    dtype = jnp.dtype(x.dtype if dtype is None else dtype)
    impl = dispatch.record("rms_norm", resolve_impl(impl, x.shape[-1]))
    if impl == "reference":
        if delta is None:
            return rms_norm_reference(x, weight, eps, dtype)
        return add_rms_norm_reference(x, delta, weight, eps, dtype)
    kw = dict(eps=eps, dtype=dtype, interpret=interpret)
    km = sharding.current()
    if km is None:
        return rms_norm_pallas(x, weight, delta, **kw)
    # rows over the batch axes; per-head norms ([B, T, heads, D]) keep their heads' sharding
    heads = [km.head_spec(x.shape[-2])] if x.ndim == 4 else [None] * (x.ndim - 2)
    rows = sharding.P(km.batch_spec(x.shape[0]), *([None] * (x.ndim - 2 - len(heads))),
                      *heads, None)
    if delta is None:
        return sharding.per_shard(lambda x, w: rms_norm_pallas(x, w, **kw), km,
                                  (rows, sharding.P(None)), rows)(x, weight)
    return sharding.per_shard(lambda x, d, w: rms_norm_pallas(x, w, d, **kw), km,
                              (rows, rows, sharding.P(None)), (rows, rows))(x, delta, weight)


__all__ = ["rms_norm", "rms_norm_pallas", "rms_norm_reference", "add_rms_norm_reference",
           "norm_grads", "rms_stats", "resolve_impl", "IMPLS", "AUTO_IMPL"]
