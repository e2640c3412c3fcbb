"""``AttentionSettings``: how ``attention`` runs; ``DecodeAttentionSettings``: how
``decode_attention`` runs; each one frozen value."""

from __future__ import annotations

import dataclasses

from kernels_pallas.dispatch import KernelSettings


@dataclasses.dataclass(frozen=True)
class AttentionSettings(KernelSettings):
    """impl: "auto" | "reference" (XLA einsum + softmax, fp32 inside) | "blocked" (the
    reference over ``block_q`` queries at a time, each block recomputed in the backward: XLA
    and deterministic, without the reference's [B, H, T, T] scores) | "cudnn"
    (``jax.nn.dot_product_attention``, GPU) | "splash" (JAX's splash attention kernel, TPU);
    "auto" takes cuDNN on GPU for bf16/fp16 heads of at most 128 (with segment ids: a
    same-document mask, a [B, 1, T, T] bias, and an even length, which cuDNN's backward with a
    bias needs), splash on TPU for lengths that are multiples of 128 (segment ids as splash's
    own), else the reference.
    ``interpret`` runs splash in TPU interpret mode.
    ``balance``: over a sequence axis, causal attention without a window swaps the second half
    of each device's queries with the mirror device's, so that each holds an early and a late
    chunk and attends as many (query, key) pairs as any other (``zigzag.py``); False keeps each
    device's own queries (the last device then attends ~2x the mean)."""

    balance: bool = True
    block_q: int = 1024

    OP = "attention"
    IMPLS = ("auto", "reference", "blocked", "cudnn", "splash")

    def __post_init__(self):
        super().__post_init__()
        self.require_positive("block_q")


@dataclasses.dataclass(frozen=True)
class DecodeAttentionSettings(KernelSettings):
    """How ``decode_attention`` (one query token over a KV cache) runs. impl: "auto" |
    "reference" (``cached_attention``: XLA, fp32 logits) | "pallas" (the split kernel of
    ``decode.py``, Triton; falls back to the reference for a cache of slots not a multiple of
    16, and for few rows x kv heads). ``block``: slots a loop step (at most; the largest power
    of two from 16 up dividing the slots); ``min_programs``: the splits are the fewest that
    keep at least this many programs, and at most ``max_splits``; ``min_heads``: below this
    many rows x kv heads the reference runs (at HwH-380m's batch 1, one to five kv heads a
    layer, the kernel gained nothing; at the Transformer's 16 it did: docs/benchmarks.md);
    ``num_warps`` / ``num_stages``: Triton's."""

    block: int = 128
    min_programs: int = 1024
    max_splits: int = 32
    min_heads: int = 8
    num_warps: int = 4
    num_stages: int = 2

    OP = "decode_attention"
    IMPLS = ("auto", "reference", "pallas")
    AUTO = {"gpu": "pallas"}

    def __post_init__(self):
        super().__post_init__()
        self.require_positive(
            "block", "min_programs", "max_splits", "min_heads", "num_warps", "num_stages"
        )
