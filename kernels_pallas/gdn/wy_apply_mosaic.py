"""GDN's WY apply as a Mosaic GPU kernel (Hopper: TMA and wgmma), ``GDNSettings(wy_apply=
"mosaic")``: the same w, u and QK as ``wy_kernels._apply_kernel`` (see there):

    w = (X diag(beta e^G)) k,   u = (X diag(beta)) v,   QK = q_scale (q k^T) o Dc

One CTA (one warpgroup) per (batch, head, group of chunks). The group's inputs stream through
``STAGES`` SMEM slots by TMA: a slot is refilled with chunk i + STAGES as soon as chunk i's
products have read it, so the kernel keeps loads in flight the way the Triton kernel, one chunk
a program, cannot; the outputs leave through one SMEM tile each by TMA, whose previous copy
out overlaps the next chunk's products. X's columns are scaled in registers and written to SMEM
as the products' A operand; k, v and k^T are the B operands in place.

Without a GPU the kernel runs under the Mosaic GPU interpreter (``interpret=True``; its
``InterpretGPUParams``), which models neither layouts nor swizzling nor a transposed wgmma
operand: there the tiles are unswizzled, vectors are plain loads and QK is a ``dot_general``,
so it checks the kernel's data flow (slots, barriers, copies, the scaling), not those three.
The compiled form is checked on a GPU and, without one, by lowering it for CUDA
(``tests/kernels/test_gdn_mosaic.py``). ``GDNSettings(wy_apply="auto")`` takes this kernel on a Hopper
GPU for the shapes it takes (``hopper``, ``takes``). It is lowered with Lane semantics (JAX
0.11's warpgroup semantics found no layout for this body).
Requires chunks of 64 (one wgmma M tile), K and V multiples of 64 and 16-bit inputs.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from kernels_pallas import compat

f32 = jnp.float32
WG = plgpu.Layout.WGMMA
CHUNK = 64  # one wgmma tile of rows
STAGES = 2  # SMEM slots of the input stream
GROUPS = (8, 4, 2, 1)  # chunks a CTA: the first that divides the sequence's chunks


def interpreter():
    """The Mosaic GPU interpreter's parameters, or None where this JAX has none (it is not yet
    public API: its module path is version-specific)."""
    return compat.mosaic_gpu_interpret()


def hopper() -> bool:
    """Whether this process's first device is a Hopper GPU (sm_90: wgmma and TMA)."""
    device = jax.devices()[0]
    return device.platform == "gpu" and getattr(device, "compute_capability", "") == "9.0"


def takes(K, V, C, dtype) -> bool:
    """Whether ``check_shapes`` accepts these shapes."""
    try:
        check_shapes(K, V, C, dtype)
    except ValueError:
        return False
    return True


def check_shapes(K, V, C, dtype):
    """Refuses, naming the value, what the kernel does not take."""
    if C != CHUNK:
        raise ValueError(f"gated_delta_rule(wy_apply='mosaic') needs chunk_size={CHUNK}, got {C}")
    for name, n in (("K", K), ("V", V)):
        if n % 64:
            raise ValueError(
                f"gated_delta_rule(wy_apply='mosaic') needs {name} a multiple of 64, got {n}"
            )
    if jnp.dtype(dtype).itemsize != 2:
        raise ValueError(
            f"gated_delta_rule(wy_apply='mosaic') takes 16-bit inputs (wgmma "
            f"operands), got {jnp.dtype(dtype).name}"
        )


def _vector(ref, layout, interp):
    """A [C] vector in ``layout`` (by row: ``WG.reduce(1)``; by column: ``WG.reduce(0)``)."""
    return ref[...] if interp else plgpu.load(ref, (), layout=layout)


def _iota(shape, dim, interp):
    if interp:
        return lax.broadcasted_iota(jnp.int32, shape, dim)
    return plgpu.broadcasted_iota(jnp.int32, shape, dim, layout=WG)


def _product(a_ref, b_ref, shape):
    """a @ b by wgmma, fp32 accumulation; both operands SMEM refs."""

    def run(acc):
        plgpu.wgmma(acc, a_ref, b_ref)
        return acc[...]

    return pl.run_scoped(run, plgpu.ACC(shape, f32))


def _chunk(q_s, k_s, v_s, x_s, b_s, g_s, xk_s, xb_s, *, q_scale, interp):
    """(w, u, QK) of one chunk from its SMEM tiles, fp32 in registers."""
    C = x_s.shape[0]
    cd = k_s.dtype
    X = x_s[...].astype(f32)
    g_i = _vector(g_s, WG.reduce(1), interp)
    g_j = _vector(g_s, WG.reduce(0), interp)
    beta_j = lax.broadcast_in_dim(_vector(b_s, WG.reduce(0), interp), (C, C), [1])
    G_j = lax.broadcast_in_dim(g_j, (C, C), [1])
    xb = X * beta_j  # X diag(beta)
    xk_s[...] = (xb * jnp.exp(G_j)).astype(cd)  # X diag(beta e^G)
    xb_s[...] = xb.astype(cd)
    plgpu.commit_smem()
    w = _product(xk_s, k_s, (C, k_s.shape[1]))
    u = _product(xb_s, v_s, (C, v_s.shape[1]))
    if interp:
        s = lax.dot_general(
            q_s[...], k_s[...], (((1,), (1,)), ((), ())), preferred_element_type=f32
        )
    else:
        s = _product(q_s, k_s.transpose((1, 0)), (C, C))
    causal = _iota((C, C), 0, interp) >= _iota((C, C), 1, interp)
    diff = lax.broadcast_in_dim(g_i, (C, C), [0]) - G_j
    return w, u, s * jnp.exp(jnp.where(causal, diff, -1e30)) * q_scale


def wy_apply_mosaic(q, k, v, beta, G, X, *, q_scale=1.0, interpret=False):
    """q, k [B, T, H, K], v [B, T, H, V], beta [B, T, H], G [B, T, H] (chunk-local cumulative
    log gates; None: no decay), X [B, T, H, C] -> (w [B, T, H, K], u [B, T, H, V],
    QK [B, T, H, C]) in k's dtype; T a multiple of the chunk. ``interpret``: False (compiled
    for the GPU) or True (the Mosaic GPU interpreter)."""
    B, T, H, K = k.shape
    V, C = v.shape[-1], X.shape[-1]
    check_shapes(K, V, C, k.dtype)
    N = T // C
    per = next(g for g in GROUPS if N % g == 0)
    stages = min(STAGES, per)
    cd = k.dtype
    interp = interpret is not False
    params = None
    if interp:
        params = interpreter()
        if params is None:
            raise ValueError(
                "gated_delta_rule(wy_apply='mosaic', interpret=True) needs the "
                f"Mosaic GPU interpreter, which JAX {jax.__version__} lacks; use "
                "wy_apply='triton' there"
            )
    by_head = lambda x: jnp.transpose(x.astype(f32), (0, 2, 1))  # [B, H, T]
    bt = by_head(beta)
    gt = jnp.zeros_like(bt) if G is None else by_head(G)
    # the interpreter keeps SMEM unswizzled: tiling and swizzle are the hardware's layout only
    tf = () if interp else (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))

    def tiles(cols, slots=None):
        return plgpu.SMEM((C, cols) if slots is None else (slots, C, cols), cd, transforms=tf)

    def gdn_wy_apply_mosaic(q_r, k_r, v_r, x_r, b_r, g_r, w_r, u_r, qk_r, ins, outs, scaled, bars):
        b, h, grp = lax.axis_index("b"), lax.axis_index("h"), lax.axis_index("g")
        rows = lambda i: pl.ds((grp * per + i) * C, C)
        tok = lambda r, i: r.at[b, rows(i), h, :]

        def issue(i, slot):
            for r, buf, bar in zip((q_r, k_r, v_r, x_r, b_r, g_r), ins, bars):
                src = r.at[b, h, rows(i)] if r.ndim == 3 else tok(r, i)
                plgpu.copy_gmem_to_smem(src, buf.at[slot], bar.at[slot])

        for i in range(stages):
            issue(i, i)

        @pl.loop(0, per)
        def _(i):
            slot = lax.rem(i, stages)
            for bar in bars:
                plgpu.barrier_wait(bar.at[slot])
            res = _chunk(*(buf.at[slot] for buf in ins), *scaled, q_scale=q_scale, interp=interp)

            @pl.when(i + stages < per)  # the slot is read: refill
            def _():
                issue(i + stages, slot)

            plgpu.wait_smem_to_gmem(0, wait_read_only=True)  # last chunk's tiles out
            for o_s, x in zip(outs, res):
                o_s[...] = x.astype(o_s.dtype)
            plgpu.commit_smem()
            for o_s, r in zip(outs, (w_r, u_r, qk_r)):
                plgpu.copy_smem_to_gmem(o_s, tok(r, i), commit_group=False)
            plgpu.commit_smem_to_gmem_group()

        plgpu.wait_smem_to_gmem(0)

    out = lambda cols: jax.ShapeDtypeStruct((B, T, H, cols), cd)
    vec = plgpu.SMEM((stages, C), f32)
    return tuple(
        plgpu.kernel(  # the body's name names the kernel in profiles
            gdn_wy_apply_mosaic,
            out_type=[out(K), out(V), out(C)],
            scratch_types=[
                (tiles(K, stages), tiles(K, stages), tiles(V, stages), tiles(C, stages), vec, vec),
                (tiles(K), tiles(V), tiles(C)),
                (tiles(C), tiles(C)),
                (plgpu.Barrier(num_barriers=stages),) * 6,
            ],
            grid=(B, H, N // per),
            grid_names=("b", "h", "g"),
            # per-thread arrays with the layouts given here; JAX 0.11 defaults to warpgroup
            # semantics (layouts inferred), which finds none for this body
            compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Lane),
            **({"interpret": params} if interp else {}),
        )(q, k, v, X.astype(cd), bt, gt)
    )
