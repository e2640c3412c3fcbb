"""HGRN's element-wise recurrence h_t = a_t h_{t-1} + b_t: the associative scan equals the
token-by-token specification (outputs, final state, gradients of a, b and the initial state;
fp32), and the decode step continues a prefix exactly."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels_pallas.gated_recurrence import (
    gated_recurrence_recurrent,
    gated_recurrence_scan,
    gated_recurrence_step,
)


def _inputs(B=2, T=37, C=6, seed=0):
    k = jax.random.split(jax.random.key(seed), 3)
    a = jax.nn.sigmoid(jax.random.normal(k[0], (B, T, C)) * 2)  # forget gates in (0, 1)
    b = jax.random.normal(k[1], (B, T, C))
    h0 = jax.random.normal(k[2], (B, C))
    return a, b, h0


def test_the_scan_equals_the_recurrence_with_gradients():
    a, b, h0 = _inputs()
    a = a.at[:, 11].set(0.0)  # a restart mid-sequence
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
    _, state = gated_recurrence_scan(a[:, :8], b[:, :8], initial_state=h0, output_final_state=True)
    for t in range(8, 12):
        state = gated_recurrence_step(a[:, t], b[:, t], state)
        np.testing.assert_allclose(state, full[:, t], rtol=1e-5, atol=1e-5)
    assert state.dtype == jnp.float32


@pytest.mark.parametrize("layout", ["triton", "tpu"])
def test_pallas_kernels_equal_the_recurrence_with_gradients(layout):
    """``impl="pallas"`` (interpreted; chunks of 16 over T = 70: five chunks, the last padded;
    channels in two programs of 16 for the Triton layout) against the token-by-token form:
    outputs, final state, and the gradients of a, b and the initial state under cotangents on
    both outputs, with a gate of 0 mid-chunk (a restart) and one at a chunk's first token."""
    from jax.experimental.pallas import tpu as pltpu

    from kernels_pallas.gated_recurrence import GatedRecurrenceSettings, gated_recurrence

    a, b, h0 = _inputs(T=70, C=32, seed=3)
    a = a.at[:, 11].set(0.0).at[:, 32].set(0.0)
    tpu = layout == "tpu"
    settings = GatedRecurrenceSettings(
        impl="pallas",
        chunk_size=16,
        block_d=128 if tpu else 16,
        interpret=pltpu.InterpretParams() if tpu else True,
    )
    w = jax.random.normal(jax.random.key(4), b.shape)
    ws = jax.random.normal(jax.random.key(5), h0.shape)

    def loss(fn):
        def f(a, b, h0):
            h, s = fn(a, b, initial_state=h0, output_final_state=True)
            return (h * w).sum() + (s * ws).sum(), (h, s)

        return jax.jit(jax.grad(f, argnums=(0, 1, 2), has_aux=True))

    g_want, (h_want, s_want) = loss(gated_recurrence_recurrent)(a, b, h0)
    g_got, (h_got, s_got) = loss(lambda *x, **kw: gated_recurrence(*x, settings=settings, **kw))(
        a, b, h0
    )
    np.testing.assert_allclose(h_got, h_want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(s_got, s_want, rtol=1e-5, atol=1e-5)
    for name, x, y in zip("a b h0".split(), g_got, g_want):
        np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-5, err_msg=name)


def test_pallas_path_bf16_dtypes_choice_and_refusals():
    from kernels_pallas import chosen
    from kernels_pallas.gated_recurrence import GatedRecurrenceSettings, gated_recurrence

    a, b, _ = _inputs(T=40, C=16, seed=6)
    settings = GatedRecurrenceSettings(impl="pallas", interpret=True, chunk_size=16)
    want, _ = gated_recurrence_recurrent(a, b)
    a16, b16 = a.astype(jnp.bfloat16), b.astype(jnp.bfloat16)
    got, none = gated_recurrence(a16, b16, settings=settings)
    assert got.dtype == jnp.float32 and none is None
    assert float(jnp.abs(got - want).max()) <= 1e-2 * float(jnp.abs(want).max())
    da, db = jax.grad(
        lambda a, b: gated_recurrence(a, b, settings=settings)[0].sum(), argnums=(0, 1)
    )(a16, b16)
    assert da.dtype == db.dtype == jnp.bfloat16
    assert chosen()["gated_recurrence@cpu"] == "pallas"
    assert GatedRecurrenceSettings().choose() == "scan"  # "auto" on the CPU
    assert GatedRecurrenceSettings(platform="gpu").choose() == "pallas"  # timed faster there
    assert GatedRecurrenceSettings(platform="tpu").choose() == "scan"  # not timed there
    with pytest.raises(ValueError, match="one shape"):
        gated_recurrence(a, b[:, 1:], settings=settings)
    with pytest.raises(ValueError, match="no compiled lowering"):
        gated_recurrence(a, b, settings=GatedRecurrenceSettings(impl="pallas"))
    with pytest.raises(ValueError, match="block_d"):
        gated_recurrence(
            jnp.ones((1, 16, 192)),
            jnp.ones((1, 16, 192)),
            settings=GatedRecurrenceSettings(
                impl="pallas", block_d=256, interpret=_tpu_interpret()
            ),
        )
    with pytest.raises(ValueError, match="chunk_size must be >= 1"):
        GatedRecurrenceSettings(chunk_size=0)


def _tpu_interpret():
    from jax.experimental.pallas import tpu as pltpu

    return pltpu.InterpretParams()


@pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 devices (conftest's CPU devices)")
def test_pallas_per_shard_under_a_mesh_and_in_hgrn_heads():
    """Under ``kernel_mesh`` the kernels run in a shard_map on each device's rows and channels
    (values and gradients of one device); HGRN heads with ``impl="pallas"`` give the outputs of
    the default associative scan."""
    from flax import nnx
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from hwh_jax.layers.heads.hgrn import HGRNHeads
    from hwh_jax.training.sharding import make_mesh
    from kernels_pallas import kernel_mesh
    from kernels_pallas.gated_recurrence import GatedRecurrenceSettings, gated_recurrence

    settings = GatedRecurrenceSettings(impl="pallas", interpret=True, chunk_size=16, block_d=8)
    a, b, h0 = _inputs(B=4, T=40, C=16, seed=7)

    def f(a, b, h0):
        h, s = gated_recurrence(a, b, initial_state=h0, output_final_state=True, settings=settings)
        return jnp.sum(jnp.sin(h)) + jnp.sum(s)

    grad = jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2)))
    want = grad(a, b, h0)
    mesh = make_mesh((2, 2, 2))
    rows = lambda x: jax.device_put(
        x, NamedSharding(mesh, P(("data", "fsdp"), *[None] * (x.ndim - 1)))
    )
    with kernel_mesh(mesh):
        assert "shard_map" in str(jax.make_jaxpr(f)(a, b, h0))
        got = grad(*(rows(x) for x in (a, b, h0)))
    for x, y in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-5)

    kw = dict(layer=1, num_layers=2, dtype=jnp.float32, param_dtype=jnp.float32)
    heads = [HGRNHeads(24, 2, 8, settings=s, rngs=nnx.Rngs(0), **kw) for s in (None, settings)]
    x = jax.random.normal(jax.random.key(8), (2, 21, 24))
    np.testing.assert_allclose(heads[1](x), heads[0](x), rtol=1e-5, atol=1e-5)
