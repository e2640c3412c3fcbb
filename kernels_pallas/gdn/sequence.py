"""The gated delta rule with its time dimension split over a mesh axis (sequence parallelism).

The state update S_t = alpha_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T ([K, V] per
head, fla's layout) is linear in the state: a shard's tokens map the state it receives to
S_out = M S_in + S_0 (``kernels_pallas.time_shards``), M [K, K] the product of its tokens'
transitions alpha_t (I - beta_t k_t k_t^T). Each shard runs its tokens once with the value
columns widened to [v, 0] and the start [0, I]: the columns of the state evolve independently,
so the final state is [S_0, M] and the outputs are [o_0, scale q_t^T P_t], o_0 the zero-start
outputs and P_t the transitions' product up to token t. With S_in folded from the gathered
pairs, the outputs are o_0 + (scale q_t^T P_t) S_in: no second pass, and no [K, K] product per
token is formed. Cost: one scan of V + K columns against one of V unsplit, on T / n tokens.
In bf16 the correction term is rounded to bf16 as the outputs are (the kernels' output
dtype), a second rounding the unsplit run does not make.

The per-shard scan is whichever implementation the settings choose (the Pallas kernels on GPU
and TPU). A decay of exp(-80) at a document's first token (``RESET_LOG_DECAY``) zeroes the
rows of M and P_t there, so documents that start inside a shard cut the state passed across it
as they cut it in the unsplit run.
"""

from __future__ import annotations

import jax.numpy as jnp

from kernels_pallas import sharding, time_shards


def _matmul(m, s):
    """M S for [B, H, K, K] and [B, H, K, V]."""
    return jnp.einsum("bhij,bhjv->bhiv", m, s, precision="highest")


def operands(km, time_axis, q, k, v, g, beta, initial_state):
    """The gated delta rule's operands laid over ``km.mesh``: rows over the batch axes, heads
    over the head axis, time over ``time_axis`` (None: unsplit). Returns (the names of those
    given, their arrays, their PartitionSpecs, the [B, T, H, X] spec, the state's spec); g or
    the initial state None is left out."""
    b, h = km.batch_spec(q.shape[0]), km.head_spec(q.shape[2])
    x4, x3 = sharding.P(b, time_axis, h, None), sharding.P(b, time_axis, h)
    st = sharding.P(b, h, None, None)
    named = {
        "q": (q, x4),
        "k": (k, x4),
        "v": (v, x4),
        "g": (g, x3),
        "beta": (beta, x3),
        "initial_state": (initial_state, st),
    }
    names = [name for name, (x, _) in named.items() if x is not None]
    return names, [named[n][0] for n in names], tuple(named[n][1] for n in names), x4, st


def over_shards(scan, km, axis: str, q, k, v, g, beta, *, initial_state, output_final_state, **kw):
    """``scan(q, k, v, g, beta, initial_state=, output_final_state=True, **kw)`` (one of the
    gated delta rule's implementations) on each shard of ``km.mesh``: rows over the batch axes,
    heads over the head axis, time over ``axis``, the states passed between time shards as the
    module docstring says. Returns (o [B, T, H, V], final state [B, H, K, V] or None)."""
    names, args, specs, x4, st = operands(km, axis, q, k, v, g, beta, initial_state)
    n = km.mesh.shape[axis]

    def local(*args):
        a = dict(zip(names, args))
        q, k, v, g, beta = a["q"], a["k"], a["v"], a.get("g"), a["beta"]
        B, _, H, K = q.shape
        V = v.shape[-1]
        f32 = jnp.float32
        wide_v = jnp.concatenate([v, jnp.zeros((*v.shape[:3], K), v.dtype)], axis=-1)
        eye = jnp.broadcast_to(jnp.eye(K, dtype=f32), (B, H, K, K))
        start = jnp.concatenate([jnp.zeros((B, H, K, V), f32), eye], axis=-1)
        o, wide = scan(q, k, wide_v, g, beta, initial_state=start, output_final_state=True, **kw)
        first = (
            a["initial_state"].astype(f32) if "initial_state" in a else jnp.zeros((B, H, K, V), f32)
        )
        s_in, last = time_shards.passed_states(
            wide[..., :V], wide[..., V:], _matmul, axis, n, first
        )
        seen = jnp.einsum("bthi,bhiv->bthv", o[..., V:].astype(f32), s_in, precision="highest")
        o = (o[..., :V].astype(f32) + seen).astype(v.dtype)
        return (o, last) if output_final_state else o

    out = (x4, st) if output_final_state else x4
    result = sharding.per_shard(local, km, specs, out)(*args)
    return result if output_final_state else (result, None)
