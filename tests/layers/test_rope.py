"""RoPE: logits depend on relative position only, for both pairings; pairings are a permutation."""

import jax.numpy as jnp
import numpy as np
import pytest

from hwh_jax.layers.rope import apply_rope, rope_frequencies


@pytest.mark.parametrize("pairing", ["half", "interleaved"])
def test_relative_position_property(pairing):
    rng = np.random.default_rng(0)
    q = jnp.asarray(rng.standard_normal((1, 1, 1, 32)), jnp.float32)
    k = jnp.asarray(rng.standard_normal((1, 1, 1, 32)), jnp.float32)

    def logit(m, n):
        qm = apply_rope(q, jnp.array([[m]]), theta=500.0, pairing=pairing)
        kn = apply_rope(k, jnp.array([[n]]), theta=500.0, pairing=pairing)
        return float(jnp.sum(qm * kn))

    for m, n, shift in [(5, 2, 11), (0, 0, 37), (100, 3, 250)]:
        assert abs(logit(m, n) - logit(m + shift, n + shift)) < 1e-3
    assert abs(logit(5, 2) - logit(5, 4)) > 1e-3  # and it does depend on the offset


@pytest.mark.parametrize("pairing", ["half", "interleaved"])
def test_norm_preserved_and_position_zero_is_identity(pairing):
    x = jnp.asarray(np.random.default_rng(1).standard_normal((2, 5, 3, 16)), jnp.float32)
    y = apply_rope(x, jnp.arange(5), pairing=pairing)
    np.testing.assert_allclose(jnp.linalg.norm(y, axis=-1), jnp.linalg.norm(x, axis=-1), rtol=1e-5)
    np.testing.assert_allclose(y[:, 0], x[:, 0], atol=1e-6)


def test_pairings_are_a_permutation_of_each_other():
    D = 8
    x = jnp.asarray(np.random.default_rng(2).standard_normal((1, 4, 1, D)), jnp.float32)
    perm = np.stack([np.arange(D // 2), np.arange(D // 2) + D // 2], -1).reshape(-1)  # half->inter
    y_half = apply_rope(x, jnp.arange(4), pairing="half")
    y_inter = apply_rope(x[..., perm], jnp.arange(4), pairing="interleaved")
    np.testing.assert_allclose(y_half[..., perm], y_inter, atol=1e-6)


def test_frequencies():
    w = rope_frequencies(8, 10000.0)
    np.testing.assert_allclose(w, 10000.0 ** (-np.arange(0, 8, 2) / 8), rtol=1e-6)
    assert w[0] == 1.0  # r = 0 is the highest frequency
