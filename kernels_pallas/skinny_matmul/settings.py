"""``SkinnyMatmulSettings``: how ``skinny_matmul`` runs, as one frozen value."""

from __future__ import annotations

import dataclasses

from kernels_pallas.dispatch import KernelSettings, pow2


@dataclasses.dataclass(frozen=True)
class SkinnyMatmulSettings(KernelSettings):
    """How ``skinny_matmul`` (x [M, K] @ w [K, N] for few rows M) runs.

    impl: "auto" | "reference" (XLA's product) | "pallas" (``pallas.py``: Triton; products of
    more than ``max_rows`` rows, or of K not a multiple of 16, run the reference); "auto": the
    kernel on a GPU, the reference elsewhere.
    block_n: output columns a program; block_k: rows of w a loop step (at most: the largest
    power of two from 16 up dividing K); min_programs: K is split until the programs (column
    blocks x splits) reach this many, while the splits' fp32 partial sums (summed in XLA)
    stay small against w (``pallas.plan``); max_rows: the most rows the kernel takes (rows
    below 16 are multiplied on CUDA cores, 16 and up on tensor cores): 1 by default, a decode
    step at batch 1, where the kernel took 9% off the step's device time on an H200; at batch
    32 it measured no faster than XLA's GEMMs (docs/benchmarks.md, "Decode and cache");
    num_warps / num_stages: Triton's."""

    block_n: int = 64
    block_k: int = 64
    min_programs: int = 256
    max_rows: int = 1
    num_warps: int = 4
    num_stages: int = 3

    OP = "skinny_matmul"
    IMPLS = ("auto", "reference", "pallas")
    AUTO = {"gpu": "pallas"}

    def __post_init__(self):
        super().__post_init__()
        self.require_positive(
            "block_n", "block_k", "min_programs", "max_rows", "num_warps", "num_stages"
        )
        for name in ("block_n", "block_k"):
            value = getattr(self, name)
            if value < 16 or not pow2(value):
                raise ValueError(f"skinny_matmul: {name} must be a power of two >= 16, got {value}")
