"""An element-wise gated linear recurrence, h_t = a_t * h_{t-1} + b_t (HGRN's form: a vector
state, no outer product).

  reference.py   token by token (``lax.scan``): the specification, and the decode step; and
                 the parallel form, an associative scan over (a, b) pairs, checked against it
  pallas.py      per-chunk row loops as Pallas kernels joined by a scan over chunk summaries
  settings.py    ``GatedRecurrenceSettings``; op.py: ``gated_recurrence``, the public entry
"""

from kernels_pallas.gated_recurrence.op import gated_recurrence
from kernels_pallas.gated_recurrence.pallas import gated_recurrence_pallas
from kernels_pallas.gated_recurrence.reference import (
    gated_recurrence_recurrent,
    gated_recurrence_scan,
    gated_recurrence_step,
)
from kernels_pallas.gated_recurrence.settings import GatedRecurrenceSettings

__all__ = [
    "GatedRecurrenceSettings",
    "gated_recurrence",
    "gated_recurrence_pallas",
    "gated_recurrence_recurrent",
    "gated_recurrence_scan",
    "gated_recurrence_step",
]
