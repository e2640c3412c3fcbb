"""One decode step of the gated delta rule as one Pallas kernel (GPU): ``step_pallas``.

Per (row, head) program, with the state S [K, V] in fp32 (``reference.gated_delta_rule_step``
is the specification):

    S' = e^g S;   v_new = beta (v - S'^T k);   S'' = S' + k v_new^T;   o = S''^T (scale q)

The state is read once and written once, in place (aliased): XLA's fusions of the reference
read it twice (the prediction S'^T k, then the update with the output), so at batch 32 a
380m layer's step moves three copies of a 7-MB state where this moves two.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

f32 = jnp.float32


def _step_kernel(q_ref, k_ref, v_ref, g_ref, b_ref, s_ref, o_ref, s_out_ref, *, scale):
    k = k_ref[...].astype(f32)[:, None]  # [K, 1]
    h = s_ref[...] * jnp.exp(g_ref[...].astype(f32))  # [K, V]
    pred = jnp.sum(h * k, axis=0, keepdims=True)  # [1, V]
    v_new = b_ref[...].astype(f32) * (v_ref[...].astype(f32)[None, :] - pred)
    h = h + k * v_new
    q = q_ref[...].astype(f32)[:, None] * scale
    o_ref[...] = jnp.sum(h * q, axis=0).astype(o_ref.dtype)
    s_out_ref[...] = h


@functools.partial(jax.jit, static_argnames=("scale", "interpret", "num_warps"))
def step_pallas(q, k, v, g, beta, state, *, scale, interpret=False, num_warps=4):
    """q, k [B, H, K]; v [B, H, V]; g, beta [B, H]; state [B, H, K, V] fp32 -> (o [B, H, V] in
    v's dtype, new state). K and V powers of two (Triton's block shapes)."""
    B, H, K = q.shape
    V = v.shape[-1]
    sq = pl.squeezed
    vec = lambda n: pl.BlockSpec((sq, sq, n), lambda b, h: (b, h, 0))
    one = pl.BlockSpec((sq, sq, 1), lambda b, h: (b, h, 0))
    mat = pl.BlockSpec((sq, sq, K, V), lambda b, h: (b, h, 0, 0))
    kw = {}
    if interpret is False:
        from jax.experimental.pallas import triton as plgpu

        kw["compiler_params"] = plgpu.CompilerParams(num_warps=num_warps, num_stages=1)
    o, new = pl.pallas_call(
        functools.partial(_step_kernel, scale=scale),
        grid=(B, H),
        in_specs=[vec(K), vec(K), vec(V), one, one, mat],
        out_specs=[vec(V), mat],
        out_shape=[
            jax.ShapeDtypeStruct((B, H, V), v.dtype),
            jax.ShapeDtypeStruct(state.shape, f32),
        ],
        input_output_aliases={5: 1},
        interpret=interpret,
        name="gdn_decode_step",
        **kw,
    )(q, k, v, g.astype(f32)[..., None], beta.astype(f32)[..., None], state.astype(f32))
    return o, new
