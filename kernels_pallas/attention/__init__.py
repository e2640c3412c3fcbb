"""Causal / sliding-window / GQA softmax attention, and attention over a KV cache.

  reference.py  XLA einsum + softmax, fp32 inside: the specification (training and decode)
  tpu.py        JAX's splash attention kernel (Pallas/Mosaic) on TPU
  cached.py     a chunk of queries over a KV cache block by block (online softmax; prefill)
  settings.py   ``AttentionSettings``
  op.py         ``attention``: shapes checked, reference / cuDNN / splash dispatched
"""
from kernels_pallas.attention.cached import cached_attention_blockwise
from kernels_pallas.attention.op import attention
from kernels_pallas.attention.reference import (attention_mask, attention_reference,
                                                cached_attention)
from kernels_pallas.attention.settings import AttentionSettings

__all__ = ["AttentionSettings", "attention", "attention_mask", "attention_reference",
           "cached_attention", "cached_attention_blockwise"]
