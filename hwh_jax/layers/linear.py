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


def project(x, layers, groups: tuple[tuple[int, ...], ...] = ()) -> list:
    """[layer(x) for layer in layers] for bias-free ``dense`` layers of one compute dtype: the
    same products, with a backward that sums x's gradient product by product, each new product
    the first operand of its sum; the layers of each of ``groups`` (tuples of indices into
    ``layers``, disjoint) as one product over their weights concatenated, and the narrow layers
    (widths not a multiple of 8) not in a group as one more.

    Autodiff sums the input gradients of several projections as ``add(sum so far, new
    product)``. XLA's GEMM rewriter folds such a sum into the new product's GEMM (beta = 1)
    only when the first GEMM it matches has none folded yet, so in a chain every other sum
    stayed a pass of its own (docs/benchmarks.md). Here each sum is ``add(new product, sum so
    far)``, in autodiff's order (the last projection's product first). A product whose
    contraction XLA pads (a width not a multiple of 8: GDN's a and b, one column a head) is a
    GEMM that takes no sum folded in, so two of them would leave one add a layer; the narrow
    layers are therefore one GEMM over their concatenated weights, forward, input gradient and
    weight gradient, and their product starts the sum. A group is one GEMM the same way, in
    the sum where its first layer's product would be: for narrow products each a pass over x
    and over x's gradient (HwH's FA q, k, v of 1-5 heads), one wider GEMM costs less than its
    parts and the copies that split its output and join its gradients (docs/benchmarks.md).
    Values: autodiff's where no two layers share a product (bitwise on the CPU); otherwise a
    shared product's sum over its layers is taken in the GEMM's fp32 accumulator."""
    dtype = layers[0].dtype
    if any(layer.dtype != dtype or layer.bias is not None for layer in layers):
        raise ValueError(
            "project: the layers must be bias-free and share one compute dtype, "
            f"got {[(layer.dtype, layer.bias is not None) for layer in layers]}"
        )
    grouped = [i for g in groups for i in g]
    if len(set(grouped)) != len(grouped) or any(not 0 <= i < len(layers) for i in grouped):
        raise ValueError(
            f"project: groups must be disjoint indices into the {len(layers)} layers, got {groups}"
        )
    ws = tuple(layer.kernel[...].astype(dtype) for layer in layers)
    narrow = tuple(i for i, w in enumerate(ws) if w.shape[1] % GEMM_ALIGN and i not in grouped)
    groups = tuple(tuple(g) for g in groups if len(g) > 1)
    return list(_project(x.astype(dtype), ws, groups, narrow if len(narrow) > 1 else ()))


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


def _units(n, groups, narrow):
    """The products of ``_project`` in the order its backward sums them: the narrow layers'
    first (the start of the sum), then each group or lone layer, the last layer's first."""
    grouped = {i for g in groups for i in g} | set(narrow)
    units = list(groups) + [(i,) for i in range(n) if i not in grouped]
    return ([narrow] if narrow else []) + sorted(units, key=lambda u: -u[0])


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _project(x, ws, groups, narrow):
    """Each w's product with x; the layers of each group, and the ``narrow`` ones (indices,
    static), as one product each."""
    ys = [None] * len(ws)
    for unit in _units(len(ws), groups, narrow):
        if len(unit) == 1:
            ys[unit[0]] = dot_last(x, ws[unit[0]])
            continue
        y = dot_last(x, jnp.concatenate([ws[i] for i in unit], axis=1))
        for i, yi in zip(unit, _split(y, [ws[i].shape[1] for i in unit])):
            ys[i] = yi
    return tuple(ys)


def _split(y, widths):
    return jnp.split(y, np.cumsum(widths)[:-1], axis=-1)


def _project_fwd(x, ws, groups, narrow):
    return _project(x, ws, groups, narrow), (x, ws)


def _project_bwd(groups, narrow, res, dys):
    x, ws = res
    rows = tuple(range(x.ndim - 1))
    dws = [None] * len(ws)
    dx = None
    for unit in _units(len(ws), groups, narrow):
        dy = dys[unit[0]] if len(unit) == 1 else jnp.concatenate([dys[i] for i in unit], axis=-1)
        w = ws[unit[0]] if len(unit) == 1 else jnp.concatenate([ws[i] for i in unit], axis=1)
        d = jax.lax.dot_general(dy, w, (((dy.ndim - 1,), (1,)), ((), ())))
        dx = d if dx is None else d + dx  # the new product first (docstring)
        dw = jax.lax.dot_general(x, dy, ((rows, rows), ((), ())))
        for i, dwi in zip(unit, _split(dw, [ws[i].shape[1] for i in unit])):
            dws[i] = dwi
    return dx, tuple(dws)


_project.defvjp(_project_fwd, _project_bwd)
