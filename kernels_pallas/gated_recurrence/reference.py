"""The element-wise gated linear recurrence of HGRN, h_t = a_t * h_{t-1} + b_t, with a_t in
[0, 1] (the forget gate) per channel. All arithmetic fp32; outputs fp32.

``gated_recurrence_recurrent`` is the specification (``lax.scan`` over tokens);
``gated_recurrence_scan`` the parallel form: ``lax.associative_scan`` over the pairs (a, b),
whose composition (a1, b1) then (a2, b2) is (a1 a2, a2 b1 + b2), so the prefix up to t is
(A_t, B_t) with h_t = A_t h_0 + B_t: log T sweeps over the sequence instead of T steps.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def gated_recurrence_step(a_t, b_t, state):
    """One decode step: a_t, b_t [B, C], state [B, C] -> new state [B, C] (fp32), which is
    also the output."""
    return a_t.astype(jnp.float32) * state.astype(jnp.float32) + b_t.astype(jnp.float32)


def _initial(a, initial_state):
    B, _, C = a.shape
    return (
        jnp.zeros((B, C), jnp.float32)
        if initial_state is None
        else initial_state.astype(jnp.float32)
    )


def gated_recurrence_recurrent(a, b, *, initial_state=None, output_final_state=False):
    """a, b [B, T, C]; state [B, C]. Returns (h [B, T, C] fp32, final state or None)."""
    h0 = _initial(a, initial_state)

    def body(h, xs):
        h = gated_recurrence_step(*xs, h)
        return h, h

    h_final, h = jax.lax.scan(body, h0, (jnp.moveaxis(a, 1, 0), jnp.moveaxis(b, 1, 0)))
    return jnp.moveaxis(h, 0, 1), (h_final if output_final_state else None)


def gated_recurrence_scan(a, b, *, initial_state=None, output_final_state=False):
    """The same as :func:`gated_recurrence_recurrent`, as an associative scan over tokens."""
    h0 = _initial(a, initial_state)
    a, b = a.astype(jnp.float32), b.astype(jnp.float32)

    def compose(first, second):
        a1, b1 = first
        a2, b2 = second
        return a1 * a2, a2 * b1 + b2

    A, Bs = jax.lax.associative_scan(compose, (a, b), axis=1)
    h = A * h0[:, None] + Bs
    return h, (h[:, -1] if output_final_state else None)
