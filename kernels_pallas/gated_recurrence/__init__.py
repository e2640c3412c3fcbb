"""An element-wise gated linear recurrence, h_t = a_t * h_{t-1} + b_t (HGRN's form: a vector
state, no outer product).

  reference.py   token by token (``lax.scan``): the specification, and the decode step; and
                 the parallel form, an associative scan over (a, b) pairs, checked against it
"""
from kernels_pallas.gated_recurrence.reference import (gated_recurrence_recurrent,
                                                       gated_recurrence_scan,
                                                       gated_recurrence_step)

__all__ = ["gated_recurrence_recurrent", "gated_recurrence_scan", "gated_recurrence_step"]
