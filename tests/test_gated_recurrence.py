"""HGRN's element-wise recurrence h_t = a_t h_{t-1} + b_t: the associative scan equals the
token-by-token specification (outputs, final state, gradients of a, b and the initial state;
fp32), and the decode step continues a prefix exactly."""
import jax
import jax.numpy as jnp
import numpy as np

from kernels_pallas.gated_recurrence import (gated_recurrence_recurrent, gated_recurrence_scan,
                                             gated_recurrence_step)


def _inputs(B=2, T=37, C=6, seed=0):
    k = jax.random.split(jax.random.key(seed), 3)
    a = jax.nn.sigmoid(jax.random.normal(k[0], (B, T, C)) * 2)      # forget gates in (0, 1)
    b = jax.random.normal(k[1], (B, T, C))
    h0 = jax.random.normal(k[2], (B, C))
    return a, b, h0


def test_the_scan_equals_the_recurrence_with_gradients():
    a, b, h0 = _inputs()
    a = a.at[:, 11].set(0.0)                                          # a restart mid-sequence
    want, want_last = gated_recurrence_recurrent(a, b, initial_state=h0, output_final_state=True)
    got, got_last = gated_recurrence_scan(a, b, initial_state=h0, output_final_state=True)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got_last, want_last, rtol=1e-5, atol=1e-5)
    w = jax.random.normal(jax.random.key(9), want.shape)

    def loss(fn):
        return lambda a, b, h0: (fn(a, b, initial_state=h0)[0] * w).sum()

    g_want = jax.grad(loss(gated_recurrence_recurrent), argnums=(0, 1, 2))(a, b, h0)
    g_got = jax.grad(loss(gated_recurrence_scan), argnums=(0, 1, 2))(a, b, h0)
    for x, y in zip(g_got, g_want):
        np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-5)


def test_decode_steps_continue_a_prefix():
    a, b, h0 = _inputs(T=12, seed=1)
    full, _ = gated_recurrence_recurrent(a, b, initial_state=h0)
    _, state = gated_recurrence_scan(a[:, :8], b[:, :8], initial_state=h0,
                                     output_final_state=True)
    for t in range(8, 12):
        state = gated_recurrence_step(a[:, t], b[:, t], state)
        np.testing.assert_allclose(state, full[:, t], rtol=1e-5, atol=1e-5)
    assert state.dtype == jnp.float32
