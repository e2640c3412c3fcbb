"""A GDN layer's whole decode token, from its projections to its gated norm, as one Pallas kernel
(GPU): ``token_pallas``, and the same in jnp, ``token_reference``.

Decoding one token through a GDN layer's heads is, written with jnp, a string of small kernels
(the short convolution over the window, SiLU, q's and k's L2 norms, the two gates, the delta
rule's two passes over the state, the gated RMS norm): at batch 1 each moves a few KB and costs
its launch. Here one program per (row, head) does all of it, the state read once and written
once (aliased). For head h with key dim K and value dim V, from the window xp [W, C] (the W - 1
previous projected inputs of q, k and v and this token's, C = n (2K + V) channels: the
convolution's input for this token) and the conv weights w [W, C]:

    q = l2norm(SiLU(sum_i w_i xp_i)[q_h]) scale,   k = l2norm(...[k_h]),   v = SiLU(...[v_h])
    beta = sigmoid(b) valid,   g = -exp(A_log) softplus(a + dt_bias) valid   (g = 0 without decay)
    S' = e^g S;   S'' = S' + k (beta (v - S'^T k))^T;   o = S''^T q
    out = o / rms(o) * norm_weight * SiLU(gate)

in fp32 throughout (the jnp layer rounds the convolution, its normalised outputs and o to the
compute dtype between its steps; this rounds only ``out``). ``valid`` False (left padding) also
needs xp's token row zeroed by the caller, as the layer does. Triton's blocks need W, K and V
powers of two and the v channels' offset 2nK a multiple of V (``token_kernel_fits``).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from kernels_pallas.dispatch import pow2

f32 = jnp.float32


def token_kernel_fits(width: int, heads: int, key_dim: int, value_dim: int) -> bool:
    """Whether ``token_pallas`` takes these shapes (the module docstring)."""
    return (
        pow2(width)
        and pow2(key_dim)
        and pow2(value_dim)
        and min(key_dim, value_dim) >= 16
        and (2 * heads * key_dim) % value_dim == 0
    )


def _silu_conv(x_ref, w_ref):
    """SiLU(sum_i w_i x_i) over the window's rows, fp32."""
    z = jnp.sum(x_ref[...].astype(f32) * w_ref[...].astype(f32), axis=0)
    return z * jax.nn.sigmoid(z)


def _l2(x, eps):
    return x * jax.lax.rsqrt(jnp.sum(x * x) + eps)


def _token_kernel(*refs, decay, scale, qk_eps, norm_eps):
    xq, xk, xv, wq, wk, wv = refs[:6]
    gates = refs[6:10] if decay else (None, refs[6], None, None)  # a, b, A_log, dt_bias
    a_ref, b_ref, alog_ref, dt_ref = gates
    gate_ref, nw_ref, valid_ref, s_ref, out_ref, s_out_ref = refs[10 if decay else 7 :]
    valid = valid_ref[...]  # [1], 1.0 or 0.0
    q = _l2(_silu_conv(xq, wq), qk_eps) * scale  # [K]
    k = _l2(_silu_conv(xk, wk), qk_eps)[:, None]  # [K, 1]
    v = _silu_conv(xv, wv)[None, :]  # [1, V]
    beta = jax.nn.sigmoid(b_ref[...].astype(f32)) * valid
    h = s_ref[...]
    if decay:
        a = a_ref[...].astype(f32) + dt_ref[...]
        softplus = jnp.maximum(a, 0.0) + jnp.log(1.0 + jnp.exp(-jnp.abs(a)))
        g = -jnp.exp(alog_ref[...]) * softplus * valid
        h = h * jnp.exp(g)
    pred = jnp.sum(h * k, axis=0, keepdims=True)  # [1, V]
    h = h + k * (beta * (v - pred))
    o = jnp.sum(h * q[:, None], axis=0)  # [V]
    r = jax.lax.rsqrt(jnp.mean(o * o) + norm_eps)
    gate = gate_ref[...].astype(f32)
    out = o * r * nw_ref[...].astype(f32) * (gate * jax.nn.sigmoid(gate))
    out_ref[...] = out.astype(out_ref.dtype)
    s_out_ref[...] = h


@functools.partial(
    jax.jit,
    static_argnames=("heads", "scale", "qk_eps", "norm_eps", "interpret", "num_warps"),
)
def token_pallas(
    xp,
    conv_w,
    a,
    b,
    gate,
    a_log,
    dt_bias,
    norm_w,
    valid,
    state,
    *,
    heads,
    scale,
    qk_eps=1e-6,
    norm_eps=1e-6,
    interpret=False,
    num_warps=4,
):
    """xp [B, W, n(2K+V)]; conv_w [W, n(2K+V)]; a (None without decay), b [B, n]; gate [B, nV];
    a_log, dt_bias [n] (None without decay); norm_w [V]; valid [B] bool; state [B, n, K, V]
    fp32 -> (out [B, nV] in gate's dtype, new state fp32). See the module docstring."""
    B, W, C = xp.shape
    n = heads
    _, _, K, V = state.shape
    if C != n * (2 * K + V) or conv_w.shape != (W, C) or gate.shape != (B, n * V):
        raise ValueError(
            f"gdn token: xp [B, W, n(2K+V)] = [{B}, {W}, {n * (2 * K + V)}], conv_w [W, C], "
            f"gate [B, nV] expected, got xp {xp.shape}, conv_w {conv_w.shape}, gate {gate.shape}"
        )
    if not token_kernel_fits(W, n, K, V):
        raise ValueError(
            f"gdn token kernel: width {W}, K {K}, V {V} must be powers of two (K, V >= 16) "
            f"and 2nK = {2 * n * K} a multiple of V"
        )
    decay = a is not None
    sq = pl.squeezed
    vo = 2 * n * K // V  # the v channels' first block of V
    win = lambda X, off: pl.BlockSpec((sq, W, X), lambda i, h: (i, 0, off + h))
    taps = lambda X, off: pl.BlockSpec((W, X), lambda i, h: (0, off + h))
    one = pl.BlockSpec((sq, sq, 1), lambda i, h: (i, h, 0))
    per_head = pl.BlockSpec((sq, 1), lambda i, h: (h, 0))
    row_v = pl.BlockSpec((sq, V), lambda i, h: (i, h))
    mat = pl.BlockSpec((sq, sq, K, V), lambda i, h: (i, h, 0, 0))
    col = lambda x: x.astype(f32).reshape(-1, 1)
    specs = [win(K, 0), win(K, n), win(V, vo), taps(K, 0), taps(K, n), taps(V, vo)]
    args = [xp, xp, xp, conv_w, conv_w, conv_w]
    if decay:
        specs += [one, one, per_head, per_head]
        args += [a[..., None], b[..., None], col(a_log), col(dt_bias)]
    else:
        specs += [one]
        args += [b[..., None]]
    weight = pl.BlockSpec((sq, V), lambda i, h: (0, 0))
    row = pl.BlockSpec((sq, 1), lambda i, h: (i, 0))
    specs += [row_v, weight, row, mat]
    args += [gate, norm_w.reshape(1, V), col(valid), state.astype(f32)]
    kw = {}
    if interpret is False:
        from jax.experimental.pallas import triton as plgpu

        kw["compiler_params"] = plgpu.CompilerParams(num_warps=num_warps, num_stages=1)
    kernel = functools.partial(
        _token_kernel, decay=decay, scale=scale, qk_eps=qk_eps, norm_eps=norm_eps
    )
    return pl.pallas_call(
        kernel,
        grid=(B, n),
        in_specs=specs,
        out_specs=[row_v, mat],
        out_shape=[
            jax.ShapeDtypeStruct((B, n * V), gate.dtype),
            jax.ShapeDtypeStruct(state.shape, f32),
        ],
        input_output_aliases={len(args) - 1: 1},
        interpret=interpret,
        name="gdn_decode_token",
        **kw,
    )(*args)


def token_reference(
    xp,
    conv_w,
    a,
    b,
    gate,
    a_log,
    dt_bias,
    norm_w,
    valid,
    state,
    *,
    heads,
    scale,
    qk_eps=1e-6,
    norm_eps=1e-6,
):
    """``token_pallas`` in jnp, batched over rows and heads (the specification)."""
    B, W, C = xp.shape
    n, (K, V) = heads, state.shape[-2:]
    z = jnp.einsum("bwc,wc->bc", xp.astype(f32), conv_w.astype(f32))
    s = z * jax.nn.sigmoid(z)
    q, k, v = s[:, : n * K], s[:, n * K : 2 * n * K], s[:, 2 * n * K :]
    l2 = lambda x: x * jax.lax.rsqrt(jnp.sum(x * x, -1, keepdims=True) + qk_eps)
    q = l2(q.reshape(B, n, K)) * scale
    k = l2(k.reshape(B, n, K))
    v = v.reshape(B, n, V)
    m = valid.astype(f32)[:, None]
    beta = jax.nn.sigmoid(b.astype(f32)) * m
    h = state.astype(f32)
    if a is not None:
        sp = jax.nn.softplus(a.astype(f32) + dt_bias.astype(f32))
        g = -jnp.exp(a_log.astype(f32)) * sp * m
        h = h * jnp.exp(g)[..., None, None]
    hp = jax.lax.Precision.HIGHEST
    pred = jnp.einsum("bhkv,bhk->bhv", h, k, precision=hp)
    h = h + k[..., :, None] * (beta[..., None] * (v - pred))[..., None, :]
    o = jnp.einsum("bhkv,bhk->bhv", h, q, precision=hp)
    r = jax.lax.rsqrt(jnp.mean(o * o, -1, keepdims=True) + norm_eps)
    g32 = gate.astype(f32).reshape(B, n, V)
    out = o * r * norm_w.astype(f32) * (g32 * jax.nn.sigmoid(g32))
    return out.reshape(B, n * V).astype(gate.dtype), h
