"""kernels_pallas.rms_norm (RMSNorm, alone and fused with the residual add) and the GDN output
norm: the references' hand-written backwards against autodiff of the formulas, the Pallas
kernels (generic interpreter on CPU; compiled as well on a GPU backend) against the reference,
the op under a device mesh, and the model's residual chaining against the unfused blocks."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from kernels_pallas.rms_norm import RMSNormSettings, rms_norm

REFERENCE = RMSNormSettings(impl="reference")

MODES = ["interpret"] + (["compiled"] if jax.default_backend() == "gpu" else [])


def formula(x, w, delta=None, eps=1e-6):
    """(h, y) by autodiff-able jnp, fp32 inside; h = x without delta."""
    h = x if delta is None else x + delta
    h32 = h.astype(jnp.float32)
    r = jax.lax.rsqrt(jnp.mean(h32 * h32, axis=-1, keepdims=True) + eps)
    return h, (h32 * r * w).astype(x.dtype)


def make(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.standard_normal(shape) * rng.uniform(0.1, 10, shape[:-1] + (1,)), dtype)
    d = jnp.asarray(rng.standard_normal(shape), dtype)
    w = jnp.asarray(1 + 0.3 * rng.standard_normal(shape[-1]), jnp.float32)
    dh = jnp.asarray(rng.standard_normal(shape), dtype)
    dy = jnp.asarray(rng.standard_normal(shape), dtype)
    return x, d, w, dh, dy


def value_and_grads(fn, x, d, w, dh, dy, add):
    """(y, h or None, dx, dd or None, dw) of fn(x, w, d) = (h, y) or y, cotangents dh, dy."""
    if add:
        (h, y), vjp = jax.vjp(lambda x, d, w: fn(x, w, d), x, d, w)
        dx, dd, dw = vjp((dh, dy))
        return y, h, dx, dd, dw
    y, vjp = jax.vjp(lambda x, w: fn(x, w, None), x, w)
    dx, dw = vjp(dy)
    return y, None, dx, None, dw


def close(a, b, tol):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    np.testing.assert_allclose(a, b, rtol=tol, atol=tol * np.abs(b).max())


@pytest.mark.parametrize("add", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_reference_backward_matches_autodiff_of_the_formula(dtype, add):
    """Same values bitwise; gradients (the residual path's dh included) within fp32 rounding,
    bf16 within the rounding of the gradients to bf16."""
    x, d, w, dh, dy = make((2, 5, 48), dtype)
    ref = value_and_grads(
        lambda x, w, d: rms_norm(x, w, d, settings=REFERENCE), x, d, w, dh, dy, add
    )
    want = value_and_grads(
        lambda x, w, d: formula(x, w, d) if d is not None else formula(x, w)[1],
        x,
        d,
        w,
        dh,
        dy,
        add,
    )
    tol = 2e-6 if dtype == "float32" else 1e-2
    for name, a, b in zip(("y", "h", "dx", "dd", "dw"), ref, want):
        if a is None:
            continue
        assert a.dtype == b.dtype, name
        if name in ("y", "h"):
            np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))
        else:
            close(a, b, tol)
            assert np.abs(np.asarray(a, np.float32)).max() > 0, name


# rows: a multiple of the kernels' blocks, an odd count (one row a program) and 2 x 3 x 5
SHAPES = [(4, 256, 128), (3, 5, 32), (2, 3, 5, 64)]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("add", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("shape", SHAPES, ids=["x".join(map(str, s)) for s in SHAPES])
def test_pallas_matches_reference(shape, dtype, add, mode):
    x, d, w, dh, dy = make(shape, dtype, seed=len(shape))
    kw = dict(settings=RMSNormSettings(impl="pallas", interpret=mode == "interpret"))
    out = value_and_grads(lambda x, w, d: rms_norm(x, w, d, **kw), x, d, w, dh, dy, add)
    ref = value_and_grads(
        lambda x, w, d: rms_norm(x, w, d, settings=REFERENCE), x, d, w, dh, dy, add
    )
    tol = 2e-6 if dtype == "float32" else 8e-3
    for name, a, b in zip(("y", "h", "dx", "dd", "dw"), out, ref):
        if a is None:
            continue
        assert a.dtype == b.dtype and a.shape == b.shape, name
        close(a, b, 1e-4 if name == "dw" and dtype == "float32" else tol)


def test_output_dtype_and_errors():
    x, d, w, _, _ = make((2, 4, 16), "bfloat16")
    assert rms_norm(x, w, dtype=jnp.float32).dtype == jnp.float32
    assert rms_norm(x, w).dtype == jnp.bfloat16
    with pytest.raises(ValueError, match=r"weight must be \[16\]"):
        rms_norm(x, w[:8])
    with pytest.raises(ValueError, match="delta must have x's shape"):
        rms_norm(x, w, d[:, :2])
    with pytest.raises(ValueError, match="impl='bogus'"):
        RMSNormSettings(impl="bogus")
    with pytest.raises(ValueError, match="power-of-two width, got 24"):
        rms_norm(
            jnp.ones((2, 24)), jnp.ones(24), settings=RMSNormSettings(impl="pallas", interpret=True)
        )
    with pytest.raises(ValueError, match="Triton .GPU. lowering only"):
        rms_norm(x, w, settings=RMSNormSettings(impl="pallas", platform="cpu"))


def test_auto_takes_the_kernels_on_gpu_where_they_run():
    from kernels_pallas.rms_norm.op import choose

    assert choose(RMSNormSettings(platform="gpu"), 1024) == "pallas"
    assert choose(RMSNormSettings(platform="gpu"), 768) == "reference"
    assert choose(RMSNormSettings(platform="tpu"), 1024) == "reference"


@pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 devices (conftest's CPU devices)")
def test_pallas_per_shard_under_a_mesh():
    """Under ``kernel_mesh``: a shard_map over batch rows, the same values and gradients (dw
    summed over the shards) as on one device."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from hwh_jax.training.sharding import make_mesh
    from kernels_pallas import kernel_mesh

    mesh = make_mesh((2, 2, 2))
    x, d, w, dh, dy = make((4, 24, 32), "float32", seed=7)

    def f(x, d, w, dh, dy):
        def loss(x, d, w):
            h, y = rms_norm(x, w, d, settings=RMSNormSettings(impl="pallas", interpret=True))
            return jnp.sum(h * dh) + jnp.sum(y * dy)

        return jax.grad(loss, argnums=(0, 1, 2))(x, d, w)

    ref = jax.jit(f)(x, d, w, dh, dy)
    rows = NamedSharding(mesh, P(("data", "fsdp")))
    args = [jax.device_put(a, rows) for a in (x, d, dh, dy)]
    with kernel_mesh(mesh):
        jaxpr = str(jax.make_jaxpr(f)(args[0], args[1], w, args[2], args[3]))
        out = jax.jit(f)(args[0], args[1], w, args[2], args[3])
    assert "shard_map" in jaxpr and "f32[24,32]" in jaxpr  # one row of 24 per shard
    for a, b in zip(out, ref):
        close(a, b, 1e-5)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_gated_rms_norm_backward_matches_autodiff_of_the_formula(dtype):
    """The GDN output norm rms(o) w SiLU(gate): the same values, gradients for o, gate and w
    within the rounding to the inputs' dtype."""
    from hwh_jax.layers.norms import gated_rms_norm

    def plain(x, gate, w):
        return (
            formula(x.astype(jnp.float32), w)[1] * jax.nn.silu(gate.astype(jnp.float32))
        ).astype(x.dtype)

    rng = np.random.default_rng(1)
    x, _, _, _, dy = make((2, 5, 3, 16), dtype, seed=1)
    gate = jnp.asarray(2 * rng.standard_normal((2, 5, 3, 16)), dtype)
    w = jnp.asarray(1 + 0.3 * rng.standard_normal(16), jnp.float32)
    ours = lambda x, g, w: gated_rms_norm(x, g, w, 1e-6, jnp.dtype(dtype))
    np.testing.assert_array_equal(
        np.asarray(ours(x, gate, w), np.float32), np.asarray(plain(x, gate, w), np.float32)
    )
    got = jax.vjp(ours, x, gate, w)[1](dy)
    want = jax.vjp(plain, x, gate, w)[1](dy)
    assert [g.dtype for g in got] == [x.dtype, gate.dtype, w.dtype]
    for g, e in zip(got, want):
        close(g, e, 2e-6 if dtype == "float32" else 1e-2)
        assert np.abs(np.asarray(g, np.float32)).max() > 0


@pytest.mark.parametrize("arch", ["hwh", "transformer"])
def test_model_chains_residual_adds_like_the_unfused_blocks(arch):
    """HybridLM.hidden (each residual add done by the norm after it) against the blocks written
    out: x += mixer(mixer_norm(x)); x += mlp(mlp_norm(x)); final_norm(x). Values and gradients."""
    from hwh_jax.models import HybridLM, model_config

    cfg = model_config(arch, "tiny", dtype="float32", la_chunk_size=16)
    model = HybridLM(cfg, rngs=nnx.Rngs(0))
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, cfg.vocab_size, (2, 24)))
    pos = jnp.arange(24)[None]

    def unfused(m):
        x = m.embed(tokens)
        for b in m.blocks:
            x = x + b.mixer(b.mixer_norm(x), pos)
            x = x + b.mlp(b.mlp_norm(x))
        return m.final_norm(x)

    loss = lambda f: lambda m: jnp.sum(jnp.sin(f(m)))
    a, ga = nnx.jit(nnx.value_and_grad(loss(lambda m: m.hidden(tokens))))(model)
    b, gb = nnx.jit(nnx.value_and_grad(loss(unfused)))(model)
    np.testing.assert_allclose(float(a), float(b), rtol=1e-5)
    for u, v in zip(jax.tree.leaves(ga), jax.tree.leaves(gb)):
        close(u, v, 1e-4)
