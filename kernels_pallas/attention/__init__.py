"""Causal / sliding-window / GQA softmax attention, and attention over a KV cache.

reference.py  XLA einsum + softmax, fp32 inside: the specification (training and decode)
tpu.py        JAX's splash attention kernel (Pallas/Mosaic) on TPU
cached.py     a chunk of queries over a KV cache block by block (online softmax; prefill)
decode.py     one query token over a KV cache, split over its slots (Triton; decode)
settings.py   ``AttentionSettings``, ``DecodeAttentionSettings``
op.py         ``attention``: shapes checked, reference / cuDNN / splash dispatched
shard_rows.py a time shard's queries over the gathered keys on cuDNN (blocks merged by lse)
"""

from kernels_pallas.attention.cached import cached_attention_blockwise
from kernels_pallas.attention.decode import decode_attention
from kernels_pallas.attention.op import attention
from kernels_pallas.attention.reference import attention_mask, attention_reference, cached_attention
from kernels_pallas.attention.settings import AttentionSettings, DecodeAttentionSettings

__all__ = [
    "AttentionSettings",
    "DecodeAttentionSettings",
    "attention",
    "attention_mask",
    "attention_reference",
    "cached_attention",
    "cached_attention_blockwise",
    "decode_attention",
]
