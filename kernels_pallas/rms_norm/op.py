"""``rms_norm``: the public entry, which checks shapes and runs the implementation its
``RMSNormSettings`` choose; under ``kernel_mesh`` the kernels run per device shard."""

from __future__ import annotations

import jax.numpy as jnp

from kernels_pallas import dispatch, sharding
from kernels_pallas.dispatch import pow2
from kernels_pallas.rms_norm.pallas import rms_norm_pallas
from kernels_pallas.rms_norm.reference import add_rms_norm_reference, rms_norm_reference
from kernels_pallas.rms_norm.settings import RMSNormSettings


def choose(settings: RMSNormSettings, dim: int) -> str:
    """The implementation ``rms_norm`` runs for rows of ``dim``."""
    impl = settings.choose()
    if settings.impl == "auto" and impl == "pallas" and not pow2(dim):
        return "reference"
    return impl


def rms_norm(
    x, weight, delta=None, *, eps: float = 1e-6, dtype=None, settings: RMSNormSettings | None = None
):
    """y = x / sqrt(mean(x^2) + eps) * weight over the last axis, in fp32, cast to ``dtype``
    (default x's). With ``delta`` (x's shape): returns (h, rms_norm(h)) with h = x + delta in
    x's dtype, the residual stream's add fused with the norm after it."""
    settings = RMSNormSettings() if settings is None else settings
    if weight.shape != x.shape[-1:]:
        raise ValueError(f"rms_norm: weight must be [{x.shape[-1]}], got {weight.shape}")
    if delta is not None:
        if delta.shape != x.shape:
            raise ValueError(f"rms_norm: delta must have x's shape {x.shape}, got {delta.shape}")
        delta = delta.astype(x.dtype)
    dtype = jnp.dtype(x.dtype if dtype is None else dtype)
    impl = dispatch.record(settings, choose(settings, x.shape[-1]))
    if impl == "reference":
        if delta is None:
            return rms_norm_reference(x, weight, eps, dtype)
        return add_rms_norm_reference(x, delta, weight, eps, dtype)
    kw = dict(eps=eps, dtype=dtype, settings=settings)
    km = sharding.current()
    if km is None:
        return rms_norm_pallas(x, weight, delta, **kw)
    # rows over the batch axes; per-head norms ([B, T, heads, D]) keep their heads' sharding
    heads = [km.head_spec(x.shape[-2])] if x.ndim == 4 else [None] * (x.ndim - 2)
    rows = sharding.P(
        km.batch_spec(x.shape[0]), *([None] * (x.ndim - 2 - len(heads))), *heads, None
    )
    if delta is None:
        return sharding.per_shard(
            lambda x, w: rms_norm_pallas(x, w, **kw), km, (rows, sharding.P(None)), rows
        )(x, weight)
    return sharding.per_shard(
        lambda x, d, w: rms_norm_pallas(x, w, d, **kw),
        km,
        (rows, rows, sharding.P(None)),
        (rows, rows),
    )(x, delta, weight)
