"""A linear recurrence with its time dimension split over a mesh axis: the states the shards
pass to each other.

Every recurrence of the kernels is linear in its state, so the tokens of one time shard map
the state they receive to the state they hand on as S_out = M S_in + S_0: S_0 the shard's
final state from a zero start, M its transition (the product of its tokens' transitions:
[K, K] a head for the delta rule, a diagonal for the decays and HGRN's gates). Each shard
computes (S_0, M) from its own tokens, the pairs are gathered over the axis (``all_gather``:
n pairs a device) and folded in order, which gives every shard the state it receives and the
state after the last shard. The outputs are linear in the received state too, so each op adds
that state's contribution to the outputs of its zero-start run (``gdn/sequence.py``,
``decay_attention/op.py``, ``gated_recurrence/op.py``): one pass over the shard's tokens.

The gather with a sequential fold was chosen over a ring of ``ppermute``s (n - 1 dependent
hops, each waiting for its predecessor's fold): one collective whose bytes are n small
states, and a fold of n steps a device, n being at most a few dozen. The backward is JAX's
transpose of these steps (the gather's is a reduce-scatter).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp


def passed_states(s0, m, apply: Callable, axis: str, n: int, start):
    """Inside ``shard_map`` over ``axis`` (``n`` devices): this shard's (S_0, M) -> (the state
    it receives, the state after the last shard). ``apply(m, s)`` is M S for one shard's M;
    ``start`` the state the first shard receives (zeros or the caller's initial state)."""
    s0s = jax.lax.all_gather(s0, axis)  # [n, ...]
    ms = jax.lax.all_gather(m, axis)
    me = jax.lax.axis_index(axis)
    s, received = start, start
    for j in range(n):  # n is small: a static loop
        s = apply(ms[j], s) + s0s[j]  # the state after shard j
        if j < n - 1:
            received = jnp.where(j < me, s, received)
    return received, s
