"""Linear attention with a decaying state: the form Lightning Attention, RetNet, Mamba-2 (SSD),
GLA and HGRN-2 share (``gated_linear_attention``; decode ``gated_linear_attention_step``).

  reference.py        token by token (``lax.scan``): the specification, and the decode step
  chunk_reference.py  the chunked form in jnp, checked against it

The decay is per head and token (scalar: Lightning, RetNet, Mamba-2) or per key dimension as
well (GLA, HGRN-2); ``g`` is its logarithm, so g = 0 is plain linear attention.
"""
from kernels_pallas.decay_attention.chunk_reference import gated_linear_attention_chunked
from kernels_pallas.decay_attention.reference import (gated_linear_attention_recurrent,
                                                      gated_linear_attention_step)

__all__ = ["gated_linear_attention_chunked", "gated_linear_attention_recurrent",
           "gated_linear_attention_step"]
