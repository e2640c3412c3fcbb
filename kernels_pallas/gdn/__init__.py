"""Gated DeltaNet: ``gated_delta_rule`` (training, prefill) and ``gated_delta_rule_step`` (decode).

reference.py        token by token (``lax.scan``): the specification, and the decode step
chunk_reference.py  the chunked WY/UT form in jnp: the plain-XLA path and the kernels' model
pallas.py           the chunked form as Pallas kernels (``wy_kernels.py`` per chunk,
                    ``linear_scan.scan`` across chunks) under one custom_vjp
wy_apply_mosaic.py  the per-chunk w, u, QK as a Mosaic GPU kernel (``wy_apply="mosaic"``)
settings.py         ``GDNSettings``: implementation and launch settings as one value
step.py             the decode step as one Pallas kernel (GPU)
op.py               ``gated_delta_rule`` and ``gated_delta_rule_step``: shapes checked, the
                    implementation dispatched
"""

from kernels_pallas.gdn.chunk_reference import gated_delta_rule_chunk_reference
from kernels_pallas.gdn.op import gated_delta_rule, gated_delta_rule_step
from kernels_pallas.gdn.pallas import gated_delta_rule_pallas
from kernels_pallas.gdn.reference import gated_delta_rule_recurrent
from kernels_pallas.gdn.settings import GDNSettings

__all__ = [
    "GDNSettings",
    "gated_delta_rule",
    "gated_delta_rule_chunk_reference",
    "gated_delta_rule_pallas",
    "gated_delta_rule_recurrent",
    "gated_delta_rule_step",
]
