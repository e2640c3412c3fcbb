"""The one way this project makes a bias-free projection with logical axis names, and the
projections of one input as a group (``project``)."""
from __future__ import annotations

import jax
from flax import nnx

INIT_STD = 0.02  # GPT-2 / Llama-style init; output projections get INIT_STD / sqrt(2 L)


def dense(d_in: int, d_out: int, names: tuple[str, str], *, std: float = INIT_STD,
          use_bias: bool = False, dtype, param_dtype, rngs: nnx.Rngs) -> nnx.Linear:
    """nnx.Linear [d_in, d_out] with normal(std) init and logical axis names ``names``."""
    return nnx.Linear(
        d_in, d_out, use_bias=use_bias, dtype=dtype, param_dtype=param_dtype, rngs=rngs,
        kernel_init=nnx.with_partitioning(nnx.initializers.normal(std), names),
        bias_init=nnx.with_partitioning(nnx.initializers.zeros_init(), (names[1],)))


def project(x, layers) -> list:
    """[layer(x) for layer in layers] for bias-free ``dense`` layers of one compute dtype: the
    same products, with a backward that sums x's gradient product by product, each new product
    the first operand of its sum.

    Autodiff sums the input gradients of several projections as ``add(sum so far, new
    product)``. XLA's GEMM rewriter folds such a sum into the new product's GEMM (beta = 1)
    only when the first GEMM it matches has none folded yet, so in a chain every other sum
    stayed a pass of its own: 70 adds of [90112, 1024] a step, 9.2 ms of HwH-380m's 2K step at
    44 sequences on an H200 (docs/benchmarks.md, session 18). Here each sum is
    ``add(new product, sum so far)``, in autodiff's order (the last projection's product
    first), so the values are those of autodiff where nothing is folded (CPU)."""
    dtype = layers[0].dtype
    if any(layer.dtype != dtype or layer.bias is not None for layer in layers):
        raise ValueError("project: the layers must be bias-free and share one compute dtype, "
                         f"got {[(layer.dtype, layer.bias is not None) for layer in layers]}")
    ws = tuple(layer.kernel[...].astype(dtype) for layer in layers)
    return list(_project(x.astype(dtype), ws))


def dot_last(x, w):
    """x [..., d] @ w [d, n] -> [..., n]."""
    return jax.lax.dot_general(x, w, (((x.ndim - 1,), (0,)), ((), ())))


@jax.custom_vjp
def _project(x, ws):
    return tuple(dot_last(x, w) for w in ws)


def _project_fwd(x, ws):
    return _project(x, ws), (x, ws)


def _project_bwd(res, dys):
    x, ws = res
    dx = None
    for w, dy in reversed(tuple(zip(ws, dys))):
        d = jax.lax.dot_general(dy, w, (((dy.ndim - 1,), (1,)), ((), ())))
        dx = d if dx is None else d + dx        # the new product first (docstring)
    rows = tuple(range(x.ndim - 1))
    return dx, tuple(jax.lax.dot_general(x, dy, ((rows, rows), ((), ()))) for dy in dys)


_project.defvjp(_project_fwd, _project_bwd)
