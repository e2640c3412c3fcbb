"""RMSNorm over the last axis, optionally fused with the residual add before it.

  rms_norm(x, w)            -> y = x / rms(x) * w                    (fp32 inside)
  rms_norm(x, w, delta=d)   -> (h, y) with h = x + d, y = rms_norm(h, w)

reference.py  jnp with hand-written backwards: the specification
pallas.py     one Triton kernel forward, one backward
settings.py   ``RMSNormSettings``
op.py         ``rms_norm``: shapes checked, the implementation dispatched
"""

from kernels_pallas.rms_norm.op import rms_norm
from kernels_pallas.rms_norm.pallas import rms_norm_pallas
from kernels_pallas.rms_norm.reference import (
    add_rms_norm_reference,
    norm_grads,
    rms_norm_reference,
    rms_stats,
)
from kernels_pallas.rms_norm.settings import RMSNormSettings

__all__ = [
    "RMSNormSettings",
    "add_rms_norm_reference",
    "norm_grads",
    "rms_norm",
    "rms_norm_pallas",
    "rms_norm_reference",
    "rms_stats",
]
