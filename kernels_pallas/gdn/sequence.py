"""The gated delta rule with its time dimension split over a mesh axis (sequence parallelism).

The state update S_t = alpha_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T ([K, V] per
head, fla's layout) is linear in the state, so a shard of the sequence maps the state it receives
to the state it hands on as S_out = M S_in + S_0: S_0 its final state from a zero start, M [K, K]
the product of its tokens' transitions alpha_t (I - beta_t k_t k_t^T). Each shard

1. runs its own tokens once with the value columns widened to [v, 0] and the start [0, I]: the
   columns of the state evolve independently, so the final state is [S_0, M] (one scan of V + K
   columns gives both; no [K, K] product per token is formed);
2. gathers every shard's (S_0, M) over the axis (``all_gather``: n x (K V + K K) floats per row
   and head) and folds them in order up to itself, which gives the state it receives;
3. runs its tokens again from that state: its outputs and final state are the unsplit run's.

The backward is JAX's transpose of these steps (the gather's is a reduce-scatter), so the
gradients are the unsplit run's too; the per-shard scan is whichever implementation the
settings choose (the Pallas kernels on GPU and TPU). Cost: a scan of V + K columns and one of V
against one of V unsplit, per shard of T / n tokens; a decay of exp(-80) at a document's first
token (``RESET_LOG_DECAY``) zeroes M's rows there, so documents that start inside a shard cut
the state passed across it as they cut it in the unsplit run.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from kernels_pallas import sharding


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
        _, wide = scan(q, k, wide_v, g, beta, initial_state=start, output_final_state=True, **kw)
        s0s = jax.lax.all_gather(wide[..., :V], axis)  # [n, B, H, K, V]
        ms = jax.lax.all_gather(wide[..., V:], axis)  # [n, B, H, K, K]
        me = jax.lax.axis_index(axis)
        s_in = a["initial_state"].astype(f32) if "initial_state" in a else jnp.zeros_like(s0s[0])
        for j in range(n - 1):  # the states shards 1..n-1 receive, in order; n is small
            passed = jnp.einsum("bhij,bhjv->bhiv", ms[j], s_in, precision="highest") + s0s[j]
            s_in = jnp.where(j < me, passed, s_in)
        o, s_out = scan(q, k, v, g, beta, initial_state=s_in, output_final_state=True, **kw)
        if not output_final_state:
            return o
        last = jax.lax.psum(jnp.where(me == n - 1, s_out, 0.0), axis)  # the last shard's
        return o, last

    out = (x4, st) if output_final_state else x4
    result = sharding.per_shard(local, km, specs, out)(*args)
    return result if output_final_state else (result, None)
