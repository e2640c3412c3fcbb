"""The element-wise gated recurrence h_t = a_t h_{t-1} + b_t as Pallas kernels:
``gated_recurrence(impl="pallas")``.

The sequence is cut into chunks of C tokens; each program takes one chunk of one row and
``block_d`` channels, and walks its C tokens in a loop (a [1, BD] row a step, every product
in fp32). Two passes of the same walk, joined by a scan over chunks:

  summary   per chunk, from a zero state: the product of its gates P_n and the state it ends
            in, L_n (``_fwd_summary_kernel``);
  chunks    the states entering each chunk, c_0 = h_0, c_{n+1} = P_n c_n + L_n: the same
            recurrence over N chunks, by ``reference.gated_recurrence_scan`` (XLA, [B, N, D]);
  walk      per chunk from c_n: h (``_fwd_walk_kernel``).

The backward runs the transposed recurrence, dh_t = do_t + a_{t+1} dh_{t+1}, backwards, the same
way: per chunk from a zero carry the product of its gates and the carry it passes on, s_n =
a_first dh_first (``_bwd_summary_kernel``); the carries entering each chunk from the right,
e_{N-1} = dS_N, e_{n-1} = P_n e_n + s_n (the chunk scan on the reversed chunks); then per chunk
from e_n: db_t = dh_t and da_t = dh_t h_{t-1} (``_bwd_walk_kernel``; h_{-1} of a chunk is its
entering state c_n), and dh_0 = e_{-1}. Saved for the backward: a, h and the c_n.

Every program is independent of the others (grid (B, N, D / BD), all parallel), so the kernels
are the same for Triton and Mosaic TPU; arrays stay [B, T, D], the chunk summaries [B, N, 1, D].
This is fla's chunk_hgrn design (a row loop per chunk, then a pass across chunks) with the
cross-chunk pass as a scan over chunk summaries instead of a sequential kernel.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from kernels_pallas.dispatch import pow2
from kernels_pallas.gated_recurrence.reference import gated_recurrence_scan
from kernels_pallas.gated_recurrence.settings import GatedRecurrenceSettings
from kernels_pallas.linear_scan.common import layout, pad_time

f32 = jnp.float32


def _row(ref, i):
    """Row i of a [C, BD] block as [1, BD] fp32."""
    return ref[pl.ds(i, 1), :].astype(f32)


def _fwd_summary_kernel(a_ref, b_ref, p_ref, l_ref, *, chunk):
    def body(i, carry):
        p, h = carry
        a = _row(a_ref, i)
        return p * a, a * h + _row(b_ref, i)

    zero = jnp.zeros(p_ref.shape, f32)
    p_ref[...], l_ref[...] = jax.lax.fori_loop(0, chunk, body, (zero + 1.0, zero))


def _fwd_walk_kernel(a_ref, b_ref, c_ref, h_ref, *, chunk):
    def body(i, h):
        h = _row(a_ref, i) * h + _row(b_ref, i)
        h_ref[pl.ds(i, 1), :] = h.astype(h_ref.dtype)
        return h

    jax.lax.fori_loop(0, chunk, body, c_ref[...].astype(f32))


def _bwd_summary_kernel(a_ref, do_ref, p_ref, s_ref, *, chunk):
    def body(j, carry):
        p, c = carry
        i = chunk - 1 - j
        a = _row(a_ref, i)
        return p * a, a * (_row(do_ref, i) + c)

    zero = jnp.zeros(p_ref.shape, f32)
    p_ref[...], s_ref[...] = jax.lax.fori_loop(0, chunk, body, (zero + 1.0, zero))


def _bwd_walk_kernel(a_ref, do_ref, h_ref, c_ref, e_ref, da_ref, db_ref, *, chunk):
    c_in = c_ref[...].astype(f32)

    def body(j, carry):
        i = chunk - 1 - j
        dh = _row(do_ref, i) + carry
        h_prev = jnp.where(i > 0, _row(h_ref, jnp.maximum(i - 1, 0)), c_in)
        da_ref[pl.ds(i, 1), :] = (dh * h_prev).astype(da_ref.dtype)
        db_ref[pl.ds(i, 1), :] = dh.astype(db_ref.dtype)
        return _row(a_ref, i) * dh

    jax.lax.fori_loop(0, chunk, body, e_ref[...].astype(f32))


def _call(kernel, ins, outs, *, B, T, D, chunk, block_d, lay, interpret, num_warps, name):
    """pallas_call over grid (B, N, D / BD). ins / outs: (array or dtype, kind) with kind "tok"
    ([B, T, D], one [C, BD] block) or "chunk" ([B, N, 1, D], one [1, BD] block)."""
    N, sq = T // chunk, pl.squeezed
    spec = {
        "tok": pl.BlockSpec((sq, chunk, block_d), lambda b, n, d: (b, n, d)),
        "chunk": pl.BlockSpec((sq, sq, 1, block_d), lambda b, n, d: (b, n, 0, d)),
    }
    shape = {"tok": (B, T, D), "chunk": (B, N, 1, D)}
    if interpret is not False and lay == "triton":
        params = {}
    elif lay == "tpu":
        from jax.experimental.pallas import tpu as pltpu

        params = {
            "compiler_params": pltpu.CompilerParams(
                dimension_semantics=("parallel", "parallel", "parallel")
            )
        }
    else:
        from jax.experimental.pallas import triton as plgpu

        params = {"compiler_params": plgpu.CompilerParams(num_warps=num_warps, num_stages=1)}
    return pl.pallas_call(
        functools.partial(kernel, chunk=chunk),
        grid=(B, N, D // block_d),
        in_specs=[spec[k] for _, k in ins],
        out_specs=[spec[k] for _, k in outs],
        out_shape=[jax.ShapeDtypeStruct(shape[k], dt) for dt, k in outs],
        interpret=interpret,
        name=name,
        **params,
    )(*(x for x, _ in ins))


def _op(launch, b_dtype):
    """The custom_vjp op on padded inputs: (a, b [B, T, D], h0 [B, D] fp32) -> (h fp32, h_T);
    ``b_dtype``: b's dtype, that of its gradient."""

    def call(kernel, ins, outs, name, B, T, D):
        return _call(kernel, ins, outs, B=B, T=T, D=D, name=name, **launch)

    def forward(a, b, h0):
        B, T, D = a.shape
        P, L = call(
            _fwd_summary_kernel,
            [(a, "tok"), (b, "tok")],
            [(f32, "chunk"), (f32, "chunk")],
            "hgrn_fwd_summary",
            B,
            T,
            D,
        )
        ends, _ = gated_recurrence_scan(P[:, :, 0], L[:, :, 0], initial_state=h0)
        c = jnp.concatenate([h0[:, None], ends[:, :-1]], axis=1)  # [B, N, D]
        (h,) = call(
            _fwd_walk_kernel,
            [(a, "tok"), (b, "tok"), (c[:, :, None], "chunk")],
            [(f32, "tok")],
            "hgrn_fwd",
            B,
            T,
            D,
        )
        return (h, ends[:, -1]), (a, h, c)

    @jax.custom_vjp
    def op(a, b, h0):
        return forward(a, b, h0)[0]

    def bwd(res, cts):
        a, h, c = res
        do, dS = cts
        B, T, D = a.shape
        do = do.astype(f32)
        P, s = call(
            _bwd_summary_kernel,
            [(a, "tok"), (do, "tok")],
            [(f32, "chunk"), (f32, "chunk")],
            "hgrn_bwd_summary",
            B,
            T,
            D,
        )
        ends, _ = gated_recurrence_scan(
            jnp.flip(P[:, :, 0], 1), jnp.flip(s[:, :, 0], 1), initial_state=dS.astype(f32)
        )
        e = jnp.flip(jnp.concatenate([dS.astype(f32)[:, None], ends[:, :-1]], axis=1), 1)
        da, db = call(
            _bwd_walk_kernel,
            [
                (a, "tok"),
                (do, "tok"),
                (h, "tok"),
                (c[:, :, None], "chunk"),
                (e[:, :, None], "chunk"),
            ],
            [(a.dtype, "tok"), (b_dtype, "tok")],
            "hgrn_bwd",
            B,
            T,
            D,
        )
        return da, db, ends[:, -1]

    op.defvjp(forward, bwd)
    return op


def gated_recurrence_pallas(
    a,
    b,
    *,
    initial_state=None,
    output_final_state=False,
    settings: GatedRecurrenceSettings = GatedRecurrenceSettings(),
):
    """Same contract as ``gated_recurrence``, as the kernels of the module docstring, launched
    as ``settings`` says (its ``impl`` is not read)."""
    B, T, D = a.shape
    lay = layout(settings)
    C = settings.chunk_size
    bd = math.gcd(D, settings.block_d)
    if lay == "tpu" and bd % 128 and bd != D:
        raise ValueError(
            f"gated_recurrence(impl='pallas') on TPU needs block_d a multiple of "
            f"128 dividing D={D} (or D itself); block_d={settings.block_d} gives "
            f"{bd} channels a program"
        )
    if lay == "tpu" and C % 8:
        raise ValueError(
            f"gated_recurrence(impl='pallas') on TPU needs chunk_size a multiple of 8, got {C}"
        )
    if lay == "triton" and settings.interpret is False and not (pow2(C) and pow2(bd)):
        raise ValueError(
            f"gated_recurrence(impl='pallas') on GPU needs chunk_size and the "
            f"channels a program takes (gcd(D={D}, block_d={settings.block_d}) = "
            f"{bd}) powers of two, got chunk_size={C}"
        )
    h0 = jnp.zeros((B, D), f32) if initial_state is None else initial_state.astype(f32)
    pad = (-T) % C
    a_p = a if pad == 0 else jnp.pad(a, ((0, 0), (0, pad), (0, 0)), constant_values=1)
    launch = dict(
        chunk=C, block_d=bd, lay=lay, interpret=settings.interpret, num_warps=settings.num_warps
    )
    h, hT = _op(launch, b.dtype)(a_p, pad_time(b, pad), h0)
    return h[:, :T], (hT if output_final_state else None)
