"""Linear attention with a decaying state: the form Lightning Attention, RetNet, Mamba-2 (SSD),
GLA and HGRN-2 share (``decay_attention``; decode ``decay_attention_step``).

  reference.py        token by token (``lax.scan``): the specification, and the decode step
  chunk_reference.py  the chunked form in jnp, checked against it
  pallas.py           the chunked form with the Pallas scan of ``kernels_pallas.linear_scan``
                      under one custom_vjp (a decay per head)
  pallas_per_key.py   the chunked form for a decay per key dimension: scan kernels that carry
                      the state transposed, the chunk-parallel rest in XLA, one custom_vjp
  settings.py         ``DecaySettings``: implementation and launch settings as one value
  op.py               ``decay_attention``: shapes checked, the implementation dispatched

The decay is per head and token (scalar: Lightning, RetNet, Mamba-2) or per key dimension as
well (GLA, HGRN-2); ``g`` is its logarithm, so g = 0 is plain linear attention.
"""

from kernels_pallas.decay_attention.chunk_reference import decay_attention_chunked
from kernels_pallas.decay_attention.op import decay_attention
from kernels_pallas.decay_attention.pallas import decay_attention_pallas
from kernels_pallas.decay_attention.pallas_per_key import decay_attention_per_key_pallas
from kernels_pallas.decay_attention.reference import (
    decay_attention_recurrent,
    decay_attention_step,
)
from kernels_pallas.decay_attention.settings import DecaySettings

__all__ = [
    "DecaySettings",
    "decay_attention",
    "decay_attention_chunked",
    "decay_attention_pallas",
    "decay_attention_per_key_pallas",
    "decay_attention_recurrent",
    "decay_attention_step",
]
