"""``RMSNormSettings``: how ``rms_norm`` runs, as one frozen value."""

from __future__ import annotations

import dataclasses

from kernels_pallas.dispatch import KernelSettings


@dataclasses.dataclass(frozen=True)
class RMSNormSettings(KernelSettings):
    """impl: "auto" | "reference" (jnp with hand-written backwards) | "pallas" (Triton kernels,
    GPU or interpreted); "auto" takes the kernels on GPU for power-of-two widths, else the
    reference (on TPU XLA fuses the reference). The kernels plan their own blocks and warps
    from the shape (``pallas.plan``)."""

    OP = "rms_norm"
    IMPLS = ("auto", "reference", "pallas")
    AUTO = {"gpu": "pallas"}
