"""The one way this project makes a bias-free projection with logical axis names."""
from __future__ import annotations

from flax import nnx

INIT_STD = 0.02  # GPT-2 / Llama-style init; output projections get INIT_STD / sqrt(2 L)


def dense(d_in: int, d_out: int, names: tuple[str, str], *, std: float = INIT_STD,
          use_bias: bool = False, dtype, param_dtype, rngs: nnx.Rngs) -> nnx.Linear:
    """nnx.Linear [d_in, d_out] with normal(std) init and logical axis names ``names``."""
    return nnx.Linear(
        d_in, d_out, use_bias=use_bias, dtype=dtype, param_dtype=param_dtype, rngs=rngs,
        kernel_init=nnx.with_partitioning(nnx.initializers.normal(std), names),
        bias_init=nnx.with_partitioning(nnx.initializers.zeros_init(), (names[1],)))
