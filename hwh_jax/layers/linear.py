"""The one way this project makes a bias-free projection with logical axis names, and the
projections of one input as a group (``project``)."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from hwh_jax.layers.variables import partitioned
from kernels_pallas import dispatch
from kernels_pallas.skinny_matmul import SkinnyMatmulSettings, skinny_matmul
from kernels_pallas.skinny_matmul.op import runs_kernel

INIT_STD = 0.02  # GPT-2 / Llama-style init; output projections get INIT_STD / sqrt(2 L)
GEMM_ALIGN = 8  # XLA pads a bf16 GEMM's dimension that is not a multiple of this (``project``)


def dense(
    d_in: int,
    d_out: int,
    names: tuple[str, str],
    *,
    std: float = INIT_STD,
    use_bias: bool = False,
    dtype,
    param_dtype,
    rngs: nnx.Rngs,
) -> nnx.Linear:
    """nnx.Linear [d_in, d_out] with normal(std) init and logical axis names ``names``."""
    return nnx.Linear(
        d_in,
        d_out,
        use_bias=use_bias,
        dtype=dtype,
        param_dtype=param_dtype,
        rngs=rngs,
        kernel_init=partitioned(nnx.initializers.normal(std), names),
        bias_init=partitioned(nnx.initializers.zeros_init(), (names[1],)),
    )


def project(x, layers) -> list:
    """[layer(x) for layer in layers] for bias-free ``dense`` layers of one compute dtype: the
    same products, with a backward that sums x's gradient product by product, each new product
    the first operand of its sum, and the narrow layers (widths not a multiple of 8) as one
    product.

    Autodiff sums the input gradients of several projections as ``add(sum so far, new
    product)``. XLA's GEMM rewriter folds such a sum into the new product's GEMM (beta = 1)
    only when the first GEMM it matches has none folded yet, so in a chain every other sum
    stayed a pass of its own (docs/benchmarks.md). Here each sum is ``add(new product, sum so
    far)``, in autodiff's order (the last projection's product first). A product whose
    contraction XLA pads (a width not a multiple of 8: GDN's a and b, one column a head) is a
    GEMM that takes no sum folded in, so two of them would leave one add a layer; the narrow
    layers are therefore one GEMM over their concatenated weights, forward, input gradient and
    weight gradient, and their product starts the sum. Values: autodiff's where there is at most one narrow layer (bitwise on the
    CPU); otherwise the narrow products' sum is taken in the GEMM's fp32 accumulator."""
    dtype = layers[0].dtype
    if any(layer.dtype != dtype or layer.bias is not None for layer in layers):
        raise ValueError(
            "project: the layers must be bias-free and share one compute dtype, "
            f"got {[(layer.dtype, layer.bias is not None) for layer in layers]}"
        )
    ws = tuple(layer.kernel[...].astype(dtype) for layer in layers)
    narrow = tuple(i for i, w in enumerate(ws) if w.shape[1] % GEMM_ALIGN)
    return list(_project(x.astype(dtype), ws, narrow if len(narrow) > 1 else ()))


def dot_last(x, w):
    """x [..., d] @ w [d, n] -> [..., n]."""
    return jax.lax.dot_general(x, w, (((x.ndim - 1,), (0,)), ((), ())))


def matmul(x, w, settings: SkinnyMatmulSettings | None = None):
    """x [..., d] @ w [d, n] -> [..., n]. With ``settings``, a product of few rows (a decode
    step's) runs ``kernels_pallas.skinny_matmul``'s kernel where those settings choose it (a
    GPU, at most ``max_rows`` rows). Otherwise XLA's product, a lone row (one token of batch
    1) computed as the first of two rows, the second zero.

    XLA's GPU compiler rewrites a vector-matrix product whose matrix has fewer than 10M
    elements (every projection of a 380m or 1b4 layer) into an elementwise multiply and a
    reduction, often two kernels that read the weight at a fraction of the bandwidth of a
    GEMM (docs/benchmarks.md, "Decode and cache"); a product of two rows stays a GEMM. The
    barriers keep the compiler from slicing the zero row away again. The values are those of
    ``dot_last``: the zero row does not touch the first."""
    rows = math.prod(x.shape[:-1])
    if settings is not None:
        if runs_kernel(settings, rows, x.shape[-1], w.shape[1]):
            return skinny_matmul(x, w, settings=settings)
        dispatch.record(settings, "reference")  # what ran, for kernels_pallas.chosen()
    if rows != 1:
        return dot_last(x, w)
    two = jax.lax.optimization_barrier(jnp.pad(x.reshape(1, x.shape[-1]), ((0, 1), (0, 0))))
    y = jax.lax.optimization_barrier(dot_last(two, w))
    return y[:1].reshape(x.shape[:-1] + (w.shape[1],))


def apply(layer: nnx.Linear, x, settings: SkinnyMatmulSettings | None = None):
    """``layer(x)`` for a bias-free ``dense`` layer, through ``matmul`` (with ``settings``)."""
    if layer.bias is not None:
        raise ValueError("linear.apply: the layer must be bias-free")
    x, w = x.astype(layer.dtype), layer.kernel[...].astype(layer.dtype)
    return matmul(x, w, settings)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _project(x, ws, narrow):
    """Each w's product with x; the ``narrow`` ones (indices, static) as one product."""
    ys = [None if i in narrow else dot_last(x, w) for i, w in enumerate(ws)]
    if narrow:
        y = dot_last(x, jnp.concatenate([ws[i] for i in narrow], axis=1))
        for i, yi in zip(narrow, _split(y, [ws[i].shape[1] for i in narrow])):
            ys[i] = yi
    return tuple(ys)


def _split(y, widths):
    return jnp.split(y, np.cumsum(widths)[:-1], axis=-1)


def _project_fwd(x, ws, narrow):
    return _project(x, ws, narrow), (x, ws)


def _project_bwd(narrow, res, dys):
    x, ws = res
    rows = tuple(range(x.ndim - 1))
    dws = [None] * len(ws)
    dx = None
    if narrow:  # one product, the start of the sum (docstring)
        dy = jnp.concatenate([dys[i] for i in narrow], axis=-1)
        w = jnp.concatenate([ws[i] for i in narrow], axis=1)
        dx = jax.lax.dot_general(dy, w, (((dy.ndim - 1,), (1,)), ((), ())))
        dw = jax.lax.dot_general(x, dy, ((rows, rows), ((), ())))
        for i, dwi in zip(narrow, _split(dw, [ws[i].shape[1] for i in narrow])):
            dws[i] = dwi
    for i in reversed(range(len(ws))):
        if i in narrow:
            continue
        d = jax.lax.dot_general(dys[i], ws[i], (((dys[i].ndim - 1,), (1,)), ((), ())))
        dx = d if dx is None else d + dx  # the new product first (docstring)
        dws[i] = jax.lax.dot_general(x, dys[i], ((rows, rows), ((), ())))
    return dx, tuple(dws)


_project.defvjp(_project_fwd, _project_bwd)
