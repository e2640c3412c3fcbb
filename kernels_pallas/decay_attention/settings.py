"""``DecaySettings``: how ``decay_attention`` runs, as one frozen value."""

from __future__ import annotations

import dataclasses

from kernels_pallas.dispatch import KernelSettings


@dataclasses.dataclass(frozen=True)
class DecaySettings(KernelSettings):
    """Implementation and launch settings of ``decay_attention``.

    impl: "auto" | "recurrent" (``reference.py``, token by token) | "chunk_reference" (the
    chunked form in XLA) | "pallas" (Pallas kernels, Triton on GPU, Mosaic on TPU: for a
    decay per head the scan of ``kernels_pallas.linear_scan``, for a decay per key dimension
    ``pallas_per_key``). "auto" is "pallas" on GPU, where both families run faster than the
    jnp form forward and backward (an H200: docs/benchmarks.md), except for key widths or
    chunks the Triton kernels do not take (not a power of two >= 16: the jnp form), and
    "chunk_reference" elsewhere (the Mosaic TPU layout is tested interpreted, never timed).
    chunk_size: C of the chunked forms. The rest concern the Pallas
    kernels only: block_v: value columns per program of the sequential scans (None:
    ``linear_scan.common.default_block_v``); num_warps / num_stages: the scans' launch on GPU
    (num_stages None: for a decay per head by the scan's grid,
    ``linear_scan.common.default_num_stages``; per key dimension 2);
    chunk_warps: the one-chunk-per-program kernels' (the outputs and gradients per chunk, the
    intra-chunk scores of a decay per key); intra_block: key columns per matmul of those
    scores' factored kernels (``intra_key``); recompute: save only the inputs for the backward
    and rerun the forward's state scan there.
    """

    chunk_size: int = 64
    block_v: int | None = None
    num_warps: int = 4
    num_stages: int | None = None
    chunk_warps: int = 4
    intra_block: int = 64
    recompute: bool = False

    OP = "decay_attention"
    IMPLS = ("auto", "recurrent", "chunk_reference", "pallas")
    AUTO = {"gpu": "pallas"}
    FALLBACK = "chunk_reference"

    def __post_init__(self):
        super().__post_init__()
        self.require_positive(
            "chunk_size",
            "num_warps",
            "chunk_warps",
            "intra_block",
            optional=("block_v", "num_stages"),
        )
