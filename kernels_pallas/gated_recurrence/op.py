"""``gated_recurrence``: the public entry, which checks shapes and runs the implementation its
``GatedRecurrenceSettings`` choose; under ``kernel_mesh`` the Pallas kernels run per device
shard (rows over the batch axes, channels over the tensor axis where it divides them)."""

from __future__ import annotations

from kernels_pallas import dispatch, sharding
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
        return gated_recurrence_recurrent(a, b, **kw)
    if impl == "scan":
        return gated_recurrence_scan(a, b, **kw)
    km = sharding.current()
    if km is None:
        return gated_recurrence_pallas(a, b, settings=settings, **kw)
    x = sharding.P(km.batch_spec(a.shape[0]), None, km.head_spec(a.shape[2]))
    st = sharding.P(x[0], x[2])
    args, specs = [a, b], [x, x]
    if initial_state is not None:
        args.append(initial_state)
        specs.append(st)

    def local(a, b, h0=None):
        h, s = gated_recurrence_pallas(
            a, b, initial_state=h0, output_final_state=output_final_state, settings=settings
        )
        return (h, s) if output_final_state else h

    out = sharding.per_shard(local, km, tuple(specs), (x, st) if output_final_state else x)(*args)
    return out if output_final_state else (out, None)
