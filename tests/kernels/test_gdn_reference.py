"""recurrent (the spec) vs chunk_reference vs the decode step, values and every gradient."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels_pallas import dispatch
from kernels_pallas.gdn import GDNSettings, gated_delta_rule, gated_delta_rule_step

# (B, T, H, K, V, chunk)
SHAPES = [
    (2, 75, 3, 32, 48, 16),
    (1, 64, 1, 16, 16, 64),
    (2, 130, 1, 32, 32, 64),
    (1, 33, 3, 8, 24, 8),
]
IDS = [f"B{b}-T{t}-H{h}-K{k}-V{v}-C{c}" for b, t, h, k, v, c in SHAPES]
# Relative-error tolerance per tensor (fp32 both sides; the chunked form reorders sums).
TOL = {
    "o": 1e-5,
    "state": 1e-5,
    "dq": 1e-5,
    "dk": 1e-5,
    "dv": 1e-5,
    "dg": 1e-5,
    "dbeta": 1e-5,
    "dh0": 1e-5,
}


def make_inputs(B, T, H, K, V, seed=0):
    """fp32 inputs in the ranges the GDN layer produces (numpy RNG: no per-shape compiles)."""
    rng = np.random.default_rng(seed)
    n = lambda *shape: rng.standard_normal(shape, dtype=np.float32)
    k = n(B, T, H, K)
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    g = -np.log1p(np.exp(-(n(B, T, H) + 2.0)))  # log_sigmoid
    beta = 1.0 / (1.0 + np.exp(-n(B, T, H)))
    arrays = (n(B, T, H, K), k, n(B, T, H, V), g, beta, n(B, H, K, V), n(B, T, H, V))
    return tuple(jnp.asarray(a, jnp.float32) for a in arrays)


def rel(a, b):
    return float(jnp.linalg.norm((a - b).ravel()) / jnp.linalg.norm(b.ravel()))


@functools.partial(jax.jit, static_argnums=(0, 8))
def run(impl, q, k, v, g, beta, h0, do, chunk):
    def loss(q, k, v, g, beta, h0):
        o, s = gated_delta_rule(
            q,
            k,
            v,
            g,
            beta,
            initial_state=h0,
            output_final_state=True,
            settings=GDNSettings(impl=impl, chunk_size=chunk),
        )
        return jnp.sum(o * do) + jnp.sum(s * s) * 0.1, (o, s)

    grads, (o, s) = jax.grad(loss, argnums=tuple(range(6)), has_aux=True)(q, k, v, g, beta, h0)
    return dict(o=o, state=s, **dict(zip(("dq", "dk", "dv", "dg", "dbeta", "dh0"), grads)))


@pytest.mark.parametrize("shape", SHAPES, ids=IDS)
@pytest.mark.parametrize("with_h0", [True, False], ids=["h0", "no_h0"])
def test_chunk_reference_matches_recurrent(shape, with_h0):
    B, T, H, K, V, C = shape
    q, k, v, g, beta, h0, do = make_inputs(B, T, H, K, V)
    h0 = h0 if with_h0 else jnp.zeros_like(h0)
    ref = run("recurrent", q, k, v, g, beta, h0, do, C)
    out = run("chunk_reference", q, k, v, g, beta, h0, do, C)
    for name, tol in TOL.items():
        assert rel(out[name], ref[name]) < tol, (name, rel(out[name], ref[name]))


def test_no_initial_state_equals_zero_state():
    q, k, v, g, beta, h0, _ = make_inputs(1, 20, 2, 8, 8)
    f = jax.jit(
        functools.partial(
            gated_delta_rule, output_final_state=True, settings=GDNSettings(chunk_size=8)
        )
    )
    a, sa = f(q, k, v, g, beta)
    b, sb = f(q, k, v, g, beta, initial_state=jnp.zeros_like(h0))
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(sa, sb)
    assert gated_delta_rule(q, k, v, g, beta)[1] is None


def test_decode_step_reproduces_recurrent():
    B, T, H, K, V = 2, 19, 3, 16, 8
    q, k, v, g, beta, h0, _ = make_inputs(B, T, H, K, V, seed=3)
    ref, ref_state = gated_delta_rule(
        q,
        k,
        v,
        g,
        beta,
        initial_state=h0,
        output_final_state=True,
        settings=GDNSettings(impl="recurrent"),
    )
    state = h0
    step = jax.jit(gated_delta_rule_step)
    for t in range(T):
        o_t, state = step(q[:, t], k[:, t], v[:, t], g[:, t], beta[:, t], state)
        assert rel(o_t, ref[:, t]) < 1e-6
    assert rel(state, ref_state) < 1e-6


@pytest.mark.parametrize("impl", ["recurrent", "chunk_reference"])
def test_extreme_decay_is_finite(impl):
    """g down to -60 per step and beta at 0 and 1: no Inf/NaN in values or gradients."""
    B, T, H, K, V = 1, 70, 2, 16, 16
    q, k, v, _, _, h0, do = make_inputs(B, T, H, K, V, seed=5)
    rng = np.random.default_rng(9)
    g = jnp.asarray(-60.0 * rng.uniform(size=(B, T, H)), jnp.float32)
    beta = jnp.asarray(rng.uniform(size=(B, T, H)) > 0.5, jnp.float32)
    out = run(impl, q, k, v, g, beta, h0, do, 16)
    for name, x in out.items():
        assert bool(jnp.all(jnp.isfinite(x))), name


def test_delta_rule_semantics_single_token():
    """One token, beta=1, g=0, zero state: the state stores v k^T, output is v (k.q) scale."""
    K, V = 4, 3
    k = jnp.array([1.0, 0, 0, 0])
    q = jnp.array([2.0, 0, 0, 0])
    v = jnp.array([1.0, 2.0, 3.0])
    o, s = gated_delta_rule_step(
        q[None, None],
        k[None, None],
        v[None, None],
        jnp.zeros((1, 1)),
        jnp.ones((1, 1)),
        jnp.zeros((1, 1, K, V)),
        scale=1.0,
    )
    np.testing.assert_allclose(o[0, 0], 2.0 * v)
    np.testing.assert_allclose(s[0, 0], jnp.outer(k, v))


def test_bad_shapes_raise_naming_the_tensor():
    q, k, v, g, beta, h0, _ = make_inputs(1, 8, 2, 4, 4)
    with pytest.raises(ValueError, match="beta"):
        gated_delta_rule(q, k, v, g, beta[:, :4])
    with pytest.raises(ValueError, match="initial_state"):
        gated_delta_rule(q, k, v, g, beta, initial_state=h0[:, :1])
    with pytest.raises(ValueError, match="impl"):
        gated_delta_rule(q, k, v, g, beta, settings=GDNSettings(impl="fast"))


def test_auto_choice_is_visible():
    q, k, v, g, beta, _, _ = make_inputs(1, 8, 1, 4, 4)
    gated_delta_rule(q, k, v, g, beta)
    assert dispatch.chosen()[f"gated_delta_rule@{jax.default_backend()}"] == GDNSettings().choose()
    assert GDNSettings(platform="gpu").choose() == GDNSettings(platform="tpu").choose() == "pallas"
    assert GDNSettings(platform="cpu").choose() == "chunk_reference"


def test_the_log_names_what_compiles_the_kernel_on_each_platform():
    """The TPU runs the WY kernel written in Pallas through Mosaic, not Triton, whatever the
    setting's name for it."""

    def lowering(**kw):
        return dispatch.lowering(GDNSettings(**kw), "triton" if "platform" in kw else "pallas")

    assert "Mosaic TPU" in lowering(platform="tpu") and "Triton" not in lowering(platform="tpu")
    assert "Triton" in lowering(platform="gpu")
    assert "interpreter" in lowering(platform="tpu", interpret=True)
    assert dispatch.lowering(GDNSettings(platform="gpu"), "mosaic").endswith("Mosaic GPU")
    assert dispatch.lowering(GDNSettings(platform="tpu"), "chunk_reference") == "XLA"


@pytest.mark.parametrize("C", [5, 16, 64, 48])
def test_unit_lower_inverse_matches_numpy(C):
    """Block substitution == LAPACK inverse, for random and for all-ones strictly-lower A
    (where a power series would cancel catastrophically: binomial terms, exact inverse tiny)."""
    from kernels_pallas.gdn.chunk_reference import unit_lower_inverse

    rng = np.random.default_rng(C)
    for A in (np.tril(rng.uniform(-1, 1, (3, C, C)), -1), np.tril(np.ones((1, C, C)), -1)):
        got = np.asarray(jax.jit(unit_lower_inverse)(jnp.asarray(A, jnp.float32)))
        want = np.linalg.inv(np.eye(C) + A)
        scale = np.abs(want).max()
        assert np.abs(got - want).max() <= 1e-5 * scale, (C, np.abs(got - want).max(), scale)
