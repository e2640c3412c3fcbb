"""The GDN heads' short causal convolution with its SiLU and (for q, k) per-head L2 norm.

reference.py  jnp: the specification (XLA fuses it as it likes)
pallas.py     one Triton kernel forward, two backward, under one custom_vjp
settings.py   ``ShortConvSettings``: implementation and launch settings as one value
op.py         ``short_conv``: shapes checked, the implementation dispatched
"""

from kernels_pallas.short_conv.op import short_conv
from kernels_pallas.short_conv.pallas import short_conv_pallas
from kernels_pallas.short_conv.reference import (
    causal_conv1d,
    doc_offsets,
    l2_normalize,
    short_conv_reference,
    silu_norm,
)
from kernels_pallas.short_conv.settings import ShortConvSettings

__all__ = [
    "ShortConvSettings",
    "causal_conv1d",
    "doc_offsets",
    "l2_normalize",
    "short_conv",
    "short_conv_pallas",
    "short_conv_reference",
    "silu_norm",
]
