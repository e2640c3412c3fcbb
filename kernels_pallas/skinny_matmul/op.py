"""``skinny_matmul``: the public entry, which checks shapes and runs the implementation its
``SkinnyMatmulSettings`` choose."""

from __future__ import annotations

import math

from kernels_pallas import dispatch, sharding
from kernels_pallas.skinny_matmul.pallas import plan, skinny_matmul_pallas
from kernels_pallas.skinny_matmul.reference import skinny_matmul_reference
from kernels_pallas.skinny_matmul.settings import SkinnyMatmulSettings


def runs_kernel(settings: SkinnyMatmulSettings, M: int, K: int, N: int) -> bool:
    """Whether ``skinny_matmul`` of M rows by a [K, N] matrix runs the kernel."""
    return (
        settings.choose() == "pallas"
        and plan(M, K, N, settings) is not None
        and dispatch.triton_target(settings)
        and sharding.current() is None
    )


def skinny_matmul(x, w, *, settings: SkinnyMatmulSettings | None = None):
    """x [..., K] @ w [K, N] -> [..., N] in x's dtype, fp32 accumulation.

    ``settings.impl`` "pallas" ("auto" on a GPU) runs the kernel (``pallas.py``) where the
    rows (x's leading dimensions multiplied) are at most ``settings.max_rows`` and K is a
    multiple of 16, on a GPU target (or ``interpret=True``) outside ``kernel_mesh``; every
    other case XLA's product (``reference.py``)."""
    settings = SkinnyMatmulSettings() if settings is None else settings
    if w.ndim != 2 or x.shape[-1] != w.shape[0]:
        raise ValueError(
            f"skinny_matmul: x [..., K] and w [K, N] expected, got x {x.shape}, w {w.shape}"
        )
    kernel = runs_kernel(settings, math.prod(x.shape[:-1]), x.shape[-1], w.shape[1])
    dispatch.record(settings, "pallas" if kernel else "reference")
    if kernel:
        return skinny_matmul_pallas(x, w, settings=settings)
    return skinny_matmul_reference(x, w.astype(x.dtype))
