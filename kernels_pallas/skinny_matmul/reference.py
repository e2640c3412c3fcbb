"""The specification of ``skinny_matmul``: x [..., K] @ w [K, N] in XLA."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def skinny_matmul_reference(x, w):
    """x [..., K] @ w [K, N] -> [..., N] in x's dtype, accumulated in fp32 (at full precision
    for fp32 inputs)."""
    prec = jax.lax.Precision.HIGHEST if x.dtype == jnp.float32 else None
    y = jax.lax.dot_general(
        x, w, (((x.ndim - 1,), (0,)), ((), ())), precision=prec, preferred_element_type=jnp.float32
    )
    return y.astype(x.dtype)
