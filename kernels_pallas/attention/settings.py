"""``AttentionSettings``: how ``attention`` runs, as one frozen value."""
from __future__ import annotations

import dataclasses

from kernels_pallas.dispatch import KernelSettings


@dataclasses.dataclass(frozen=True)
class AttentionSettings(KernelSettings):
    """impl: "auto" | "reference" (XLA einsum + softmax, fp32 inside) | "cudnn"
    (``jax.nn.dot_product_attention``, GPU) | "splash" (JAX's splash attention kernel, TPU);
    "auto" takes cuDNN on GPU for bf16/fp16 heads of at most 128 without segment ids, splash on
    TPU for lengths that are multiples of 128 without segment ids, else the reference.
    ``interpret`` runs splash in TPU interpret mode."""
    OP = "attention"
    IMPLS = ("auto", "reference", "cudnn", "splash")
