"""``GDNSettings``: how ``gated_delta_rule`` runs, as one frozen value."""

from __future__ import annotations

import dataclasses

from kernels_pallas.dispatch import KernelSettings

FP32_DOTS = ("tf32", "ieee")
WY_APPLY = ("auto", "triton", "mosaic")


@dataclasses.dataclass(frozen=True)
class GDNSettings(KernelSettings):
    """Implementation and launch settings of ``gated_delta_rule``.

    impl: "auto" | "recurrent" (``reference.py``, token by token) | "chunk_reference" (the
    chunked form in XLA) | "pallas" (the chunked form as Pallas kernels: Triton on GPU, Mosaic
    on TPU); "auto" takes the kernels on GPU and TPU, the XLA chunked form elsewhere.
    chunk_size: C of the chunked forms. The rest concern the Pallas kernels only:
    block_v: value columns per program of the sequential scans (None: ``default_block_v``);
    num_warps / num_stages: the scans' launch on GPU (num_warps also the decode step
    kernel's, ``gated_delta_rule_step``; num_stages None: by the scan's grid,
    ``linear_scan.common.default_num_stages``); chunk_warps: the per-chunk kernels';
    inverse_warps: the WY inverse's among them (its time is the latency of dependent row
    reductions, which one warp does without shared memory); fp32_dots: precision of the WY
    backward's fp32 x fp32 products on GPU, "tf32" (tensor cores) or "ieee";
    recompute: save only X for the backward and recompute w, QK, S_n, v there (less memory,
    two kernels more).
    wy_apply: the kernel that forms w, u and QK from X on GPU: "triton" (``wy_kernels``),
    "mosaic" (``wy_apply_mosaic``: Mosaic GPU, TMA and wgmma; chunks of 64, K and V multiples
    of 64, 16-bit inputs; with interpret=True the Mosaic GPU interpreter) or "auto": "mosaic"
    where it runs compiled (a Hopper GPU, shapes it takes), where it took less time than the
    Triton kernel (docs/benchmarks.md, "The WY apply on Mosaic GPU"), else "triton".
    step_min_programs: ``gated_delta_rule_step`` runs its kernel (one program per row and
    head) from this many rows x heads, the jnp step below: at 13 programs (380m, batch 1) the
    kernel was slower than XLA's fusions, at 416 (batch 32) faster (docs/benchmarks.md,
    "Decode and cache").
    """

    chunk_size: int = 64
    block_v: int | None = None
    num_warps: int = 4
    num_stages: int | None = None
    chunk_warps: int = 4
    inverse_warps: int = 1
    fp32_dots: str = "tf32"
    recompute: bool = False
    step_min_programs: int = 128
    wy_apply: str = "auto"

    OP = "gated_delta_rule"
    IMPLS = ("auto", "recurrent", "chunk_reference", "pallas")
    AUTO = {"gpu": "pallas", "tpu": "pallas"}
    FALLBACK = "chunk_reference"

    def __post_init__(self):
        super().__post_init__()
        self.require_positive(
            "chunk_size",
            "num_warps",
            "chunk_warps",
            "inverse_warps",
            "step_min_programs",
            optional=("block_v", "num_stages"),
        )
        if self.wy_apply not in WY_APPLY:
            raise ValueError(
                f"gated_delta_rule: wy_apply must be one of {WY_APPLY}, got {self.wy_apply!r}"
            )
        if self.fp32_dots not in FP32_DOTS:
            raise ValueError(
                f"gated_delta_rule: fp32_dots must be one of {FP32_DOTS}, got {self.fp32_dots!r}"
            )
