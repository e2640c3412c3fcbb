"""``decay_attention``: the public entry, which checks shapes and runs the implementation
its ``DecaySettings`` choose; under ``kernel_mesh`` the Pallas kernels run per device shard,
and a mesh with a sequence axis splits the time dimension (``kernels_pallas.time_shards``: a
shard's transition is the diagonal exp(sum of its log decays), and the state it receives adds
scale (q_t * exp(G_t)) S_in to its zero-start outputs, G_t the log decays summed up to t)."""

from __future__ import annotations

import jax.numpy as jnp

from kernels_pallas import dispatch, sharding, time_shards
from kernels_pallas.decay_attention.chunk_reference import decay_attention_chunked
from kernels_pallas.decay_attention.pallas import decay_attention_pallas
from kernels_pallas.decay_attention.pallas_per_key import decay_attention_per_key_pallas
from kernels_pallas.decay_attention.reference import decay_attention_recurrent, per_key
from kernels_pallas.decay_attention.settings import DecaySettings
from kernels_pallas.linear_scan.common import triton_takes


def _check_shapes(q, k, v, g, initial_state):
    if q.ndim != 4:
        raise ValueError(f"decay_attention: q must be [B,T,H,K], got shape {q.shape}")
    B, T, H, K = q.shape
    if k.shape != q.shape:
        raise ValueError(f"decay_attention: k shape {k.shape} != q shape {q.shape}")
    if v.ndim != 4 or v.shape[:3] != (B, T, H):
        raise ValueError(f"decay_attention: v must be [B={B},T={T},H={H},V], got {v.shape}")
    if g.shape not in ((B, T, H), (B, T, H, K)):
        raise ValueError(
            f"decay_attention: g must be [B,T,H]={(B, T, H)} (a decay per "
            f"head) or [B,T,H,K]={(B, T, H, K)} (per key), got {g.shape}"
        )
    if initial_state is not None and initial_state.shape != (B, H, K, v.shape[-1]):
        raise ValueError(
            f"decay_attention: initial_state must be [B,H,K,V]="
            f"{(B, H, K, v.shape[-1])}, got {initial_state.shape}"
        )


def decay_attention(
    q,
    k,
    v,
    g,
    *,
    scale=None,
    initial_state=None,
    output_final_state=False,
    settings: DecaySettings | None = None,
):
    """Linear attention with a decaying state over a sequence, fla layout.

    Args:
      q, k: [B, T, H, K]; v: [B, T, H, V]; g: log decay (<= 0), [B, T, H] (per head) or
      [B, T, H, K] (per key dimension); scale: query scale, default K**-0.5;
      initial_state: [B, H, K, V] (fp32); output_final_state: also return the last state;
      settings: which implementation and how it is launched (default ``DecaySettings()``).
    Returns:
      (o [B, T, H, V] in v's dtype, final state [B, H, K, V] fp32 or None).
    """
    settings = DecaySettings() if settings is None else settings
    _check_shapes(q, k, v, g, initial_state)
    impl = settings.choose()
    if (
        settings.impl == "auto"
        and impl == "pallas"
        and settings.target() == "gpu"
        and not (triton_takes(q.shape[-1]) and triton_takes(settings.chunk_size))
    ):
        impl = settings.FALLBACK  # a shape the Triton kernels refuse: the jnp form
    impl = dispatch.record(settings, impl)
    kw = dict(scale=scale, initial_state=initial_state, output_final_state=output_final_state)
    if impl == "recurrent":
        scan, extra = decay_attention_recurrent, {}
    elif impl == "chunk_reference":
        scan, extra = decay_attention_chunked, {"chunk_size": settings.chunk_size}
    else:
        scan = decay_attention_pallas if g.ndim == 3 else decay_attention_per_key_pallas
        extra = {"settings": settings}
    km = sharding.current()
    axis = km.seq_spec(q.shape[1]) if km is not None else None
    if axis is not None:  # the time dimension split over a mesh axis
        return _over_shards(scan, km, axis, q, k, v, g, **kw, **extra)
    if km is None or impl != "pallas":  # XLA partitions the jnp forms itself
        return scan(q, k, v, g, **kw, **extra)
    return _over_shards(scan, km, None, q, k, v, g, **kw, **extra)


def _over_shards(scan, km, axis, q, k, v, g, *, scale, initial_state, output_final_state, **kw):
    """``scan`` on each device's rows and heads (``kernels_pallas.sharding``), time over
    ``axis`` (None: each device takes the whole sequence), the states passed between time
    shards as the module docstring says."""
    b, h = km.batch_spec(q.shape[0]), km.head_spec(q.shape[2])
    x4, x3, st = sharding.P(b, axis, h, None), sharding.P(b, axis, h), sharding.P(b, h, None, None)
    args, specs = [q, k, v, g], [x4, x4, x4, x3 if g.ndim == 3 else x4]
    if initial_state is not None:
        args.append(initial_state)
        specs.append(st)
    n = km.mesh.shape[axis] if axis is not None else 1

    def local(q, k, v, g, h0=None):
        if axis is None:
            o, s = scan(
                q,
                k,
                v,
                g,
                scale=scale,
                initial_state=h0,
                output_final_state=output_final_state,
                **kw,
            )
            return (o, s) if output_final_state else o
        B, _, H, K = q.shape
        f32 = jnp.float32
        o, s0 = scan(q, k, v, g, scale=scale, output_final_state=True, **kw)
        logs = jnp.cumsum(g.astype(f32), axis=1)  # [B, T, H] or [B, T, H, K]
        decays = per_key(jnp.exp(logs), K, token_axis=True)  # [B, T, H, K]
        m = per_key(jnp.exp(logs[:, -1]), K, token_axis=False)  # [B, H, K]
        first = jnp.zeros_like(s0) if h0 is None else h0.astype(f32)
        s_in, last = time_shards.passed_states(s0, m, lambda m, s: m[..., None] * s, axis, n, first)
        qs = q.astype(f32) * decays * (K**-0.5 if scale is None else scale)
        seen = jnp.einsum("bthk,bhkv->bthv", qs, s_in, precision="highest")
        o = (o.astype(f32) + seen).astype(v.dtype)
        return (o, last) if output_final_state else o

    out = sharding.per_shard(local, km, tuple(specs), (x4, st) if output_final_state else x4)(*args)
    return out if output_final_state else (out, None)
