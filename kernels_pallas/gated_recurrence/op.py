"""``gated_recurrence``: the public entry, which checks shapes and runs the implementation its
``GatedRecurrenceSettings`` choose; under ``kernel_mesh`` the Pallas kernels run per device
shard (rows over the batch axes, channels over the tensor axis where it divides them), and a
mesh with a sequence axis splits the time dimension (``kernels_pallas.time_shards``: a shard's
transition is the product of its gates, and the state it receives adds A_t h_in to its
zero-start outputs, A_t the gates' product up to t)."""

from __future__ import annotations

import jax.numpy as jnp

from kernels_pallas import dispatch, sharding, time_shards
from kernels_pallas.gated_recurrence.pallas import gated_recurrence_pallas
from kernels_pallas.gated_recurrence.reference import (
    gated_recurrence_recurrent,
    gated_recurrence_scan,
)
from kernels_pallas.gated_recurrence.settings import GatedRecurrenceSettings


def gated_recurrence(
    a,
    b,
    *,
    initial_state=None,
    output_final_state=False,
    settings: GatedRecurrenceSettings | None = None,
):
    """h_t = a_t * h_{t-1} + b_t per channel (HGRN's recurrence).

    Args:
      a, b: [B, T, D] (gates and inputs); initial_state: [B, D] (fp32); output_final_state:
      also return h at the last token; settings: which implementation and how it is launched
      (default ``GatedRecurrenceSettings()``).
    Returns:
      (h [B, T, D] fp32, final state [B, D] fp32 or None).
    """
    settings = GatedRecurrenceSettings() if settings is None else settings
    if a.ndim != 3 or b.shape != a.shape:
        raise ValueError(
            f"gated_recurrence: a and b must be [B, T, D] of one shape, got {a.shape} and {b.shape}"
        )
    if initial_state is not None and initial_state.shape != (a.shape[0], a.shape[2]):
        raise ValueError(
            f"gated_recurrence: initial_state must be [B, D]="
            f"{(a.shape[0], a.shape[2])}, got {initial_state.shape}"
        )
    impl = dispatch.record(settings, settings.choose())
    kw = dict(initial_state=initial_state, output_final_state=output_final_state)
    if impl == "recurrent":
        scan, extra = gated_recurrence_recurrent, {}
    elif impl == "scan":
        scan, extra = gated_recurrence_scan, {}
    else:
        scan, extra = gated_recurrence_pallas, {"settings": settings}
    km = sharding.current()
    axis = km.seq_spec(a.shape[1]) if km is not None else None
    if km is None or (axis is None and impl != "pallas"):  # XLA partitions the jnp forms
        return scan(a, b, **kw, **extra)
    return _over_shards(scan, km, axis, a, b, **kw, **extra)


def _over_shards(scan, km, axis, a, b, *, initial_state, output_final_state, **kw):
    """``scan`` on each device's rows and channels (``kernels_pallas.sharding``), time over
    ``axis`` (None: each device takes the whole sequence), the states passed between time
    shards as the module docstring says."""
    x = sharding.P(km.batch_spec(a.shape[0]), axis, km.head_spec(a.shape[2]))
    st = sharding.P(x[0], x[2])
    args, specs = [a, b], [x, x]
    if initial_state is not None:
        args.append(initial_state)
        specs.append(st)
    n = km.mesh.shape[axis] if axis is not None else 1

    def local(a, b, h0=None):
        if axis is None:
            h, s = scan(a, b, initial_state=h0, output_final_state=output_final_state, **kw)
            return (h, s) if output_final_state else h
        h, s0 = scan(a, b, output_final_state=True, **kw)
        gates = jnp.cumprod(a.astype(jnp.float32), axis=1)  # [B, T, D]
        first = jnp.zeros_like(s0) if h0 is None else h0.astype(jnp.float32)
        h_in, last = time_shards.passed_states(s0, gates[:, -1], lambda m, s: m * s, axis, n, first)
        h = h + gates * h_in[:, None]
        return (h, last) if output_final_state else h

    out = sharding.per_shard(local, km, tuple(specs), (x, st) if output_final_state else x)(*args)
    return out if output_final_state else (out, None)
