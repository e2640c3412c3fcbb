"""``ShortConvSettings``: how ``short_conv`` runs, as one frozen value."""

from __future__ import annotations

import dataclasses

from kernels_pallas.dispatch import KernelSettings


@dataclasses.dataclass(frozen=True)
class ShortConvSettings(KernelSettings):
    """impl: "auto" | "reference" (jnp) | "pallas" (Triton kernels, GPU or interpreted); "auto"
    takes the kernels on GPU where a head has a power of two >= 16 channels, else the reference
    (TPU has no Mosaic layout of these kernels: XLA fuses the reference there).
    block_t: tokens a program; num_warps: warps a program (GPU)."""

    block_t: int = 64
    num_warps: int = 4

    OP = "short_conv"
    IMPLS = ("auto", "reference", "pallas")
    AUTO = {"gpu": "pallas"}

    def __post_init__(self):
        super().__post_init__()
        if self.block_t < 1 or self.num_warps < 1:
            raise ValueError(
                f"short_conv: block_t and num_warps must be >= 1, got "
                f"{self.block_t}, {self.num_warps}"
            )
