"""``GatedRecurrenceSettings``: how ``gated_recurrence`` runs, as one frozen value."""

from __future__ import annotations

import dataclasses

from kernels_pallas.dispatch import KernelSettings


@dataclasses.dataclass(frozen=True)
class GatedRecurrenceSettings(KernelSettings):
    """Implementation and launch settings of ``gated_recurrence`` (h_t = a_t h_{t-1} + b_t).

    impl: "auto" | "recurrent" (``lax.scan`` over tokens, the specification) | "scan" (XLA's
    associative scan over tokens) | "pallas" (``pallas.py``: per-chunk row loops in Pallas, the
    chunks joined by a scan over chunk summaries). "auto" is "pallas" on GPU (faster than the
    scan there, docs/benchmarks.md, "The other kernels"), "scan" elsewhere (the TPU kernels are tested
    in interpret mode, not timed). chunk_size: tokens a program walks;
    block_d: channels a program takes (a power of two for Triton; a multiple of 128, or all
    channels, for Mosaic TPU); num_warps: the kernels' launch on GPU.
    """

    chunk_size: int = 64
    block_d: int = 128
    num_warps: int = 4

    OP = "gated_recurrence"
    IMPLS = ("auto", "recurrent", "scan", "pallas")
    AUTO = {"gpu": "pallas"}
    FALLBACK = "scan"

    def __post_init__(self):
        super().__post_init__()
        self.require_positive("chunk_size", "block_d", "num_warps")
