"""A product of a few rows by a matrix (a decode step's projections), x [M, K] @ w [K, N].

reference.py  the product in XLA (fp32 accumulation, the inputs' dtype out): the specification
pallas.py     one Triton kernel over column blocks and splits of K; the splits summed in XLA
settings.py   ``SkinnyMatmulSettings``
op.py         ``skinny_matmul``: shapes checked, the implementation dispatched
"""

from kernels_pallas.skinny_matmul.op import skinny_matmul
from kernels_pallas.skinny_matmul.pallas import plan, skinny_matmul_pallas
from kernels_pallas.skinny_matmul.reference import skinny_matmul_reference
from kernels_pallas.skinny_matmul.settings import SkinnyMatmulSettings

__all__ = [
    "SkinnyMatmulSettings",
    "plan",
    "skinny_matmul",
    "skinny_matmul_pallas",
    "skinny_matmul_reference",
]
