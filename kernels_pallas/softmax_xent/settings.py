"""``SoftmaxXentSettings``: how ``softmax_xent`` runs, as one frozen value."""

from __future__ import annotations

import dataclasses

from kernels_pallas.dispatch import KernelSettings


@dataclasses.dataclass(frozen=True)
class SoftmaxXentSettings(KernelSettings):
    """impl: "auto" | "reference" (jnp) | "pallas" (one Triton kernel, GPU or interpreted);
    "auto" takes the kernel on GPU where the vocabulary is a multiple of ``MIN_WIDTH`` and not
    split over devices, else the reference. block_v: the widest chunk of columns (a power of
    two); num_warps (None: 4) and num_stages: the kernel's launch on GPU."""

    block_v: int = 4096
    num_warps: int | None = None
    num_stages: int = 1

    OP = "softmax_xent"
    IMPLS = ("auto", "reference", "pallas")
    AUTO = {"gpu": "pallas"}

    def __post_init__(self):
        super().__post_init__()
        if self.block_v < 1 or self.num_stages < 1 or (self.num_warps or 1) < 1:
            raise ValueError(
                f"softmax_xent: block_v, num_warps and num_stages must be >= 1, "
                f"got {self.block_v}, {self.num_warps}, {self.num_stages}"
            )
