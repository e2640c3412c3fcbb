"""kernels_pallas.short_conv: the jnp reference against a per-token loop, the Pallas kernels
(generic interpreter on CPU; compiled as well on a GPU backend) against the reference, values
and gradients, and the op under a device mesh."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels_pallas.short_conv import ShortConvSettings, doc_offsets, short_conv, short_conv_pallas

REFERENCE = ShortConvSettings(impl="reference")

MODES = ["interpret"] + (["compiled"] if jax.default_backend() == "gpu" else [])


def brute_force(x, w, seg, heads, normalize, eps=1e-6):
    """Token by token in float64: taps at t - (W-1) + i that are >= 0 and in the same run of
    equal segment ids as t."""
    x, w = np.asarray(x, np.float64), np.asarray(w, np.float64)
    B, T, C = x.shape
    W = w.shape[0]
    y = np.zeros_like(x)
    for b in range(B):
        for t in range(T):
            for i in range(W):
                s = t - (W - 1) + i
                if s < 0 or (seg is not None and len(set(np.asarray(seg)[b, s : t + 1])) > 1):
                    continue
                y[b, t] += w[i] * x[b, s]
    y = y / (1 + np.exp(-y))
    if normalize:
        y = y.reshape(B, T, heads, C // heads)
        y = y / np.sqrt(np.sum(y * y, -1, keepdims=True) + eps)
    return y.reshape(B, T, C)


def make(B, T, C, W=4, seed=0, segments=True, dtype=jnp.float32):
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.normal(size=(B, T, C)), dtype)
    w = jnp.asarray(rng.normal(size=(W, C)) * 0.5, jnp.float32)
    dy = jnp.asarray(rng.normal(size=(B, T, C)), jnp.float32)
    seg = jnp.asarray(np.cumsum(rng.random((B, T)) < 0.06, axis=1), jnp.int32) if segments else None
    return x, w, seg, dy


@functools.partial(jax.jit, static_argnames=("impl", "heads", "normalize", "block_t", "scale"))
def value_and_grads(x, w, seg, dy, *, impl, heads, normalize, block_t=64, scale=1.0):
    def loss(x, w):
        if impl == "reference":
            y = short_conv(
                x, w, seg, heads=heads, normalize=normalize, scale=scale, settings=REFERENCE
            )
        else:
            settings = ShortConvSettings(block_t=block_t, interpret=impl == "interpret")
            y = short_conv_pallas(
                x, w, seg, heads=heads, normalize=normalize, scale=scale, settings=settings
            )
        return jnp.sum(y.astype(jnp.float32) * dy), y

    (_, y), (dx, dw) = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(x, w)
    return y, dx, dw


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.mark.parametrize("normalize", [True, False])
def test_reference_matches_token_loop(normalize):
    x, w, seg, _ = make(2, 23, 8, seed=1)
    seg = seg.at[1, 9:].set(0)  # an id change to a smaller id, too
    y = short_conv(x, w, seg, heads=2, normalize=normalize, settings=REFERENCE)
    np.testing.assert_allclose(y, brute_force(x, w, seg, 2, normalize), rtol=2e-5, atol=2e-6)
    y = short_conv(x, w, None, heads=2, normalize=normalize, settings=REFERENCE)
    np.testing.assert_allclose(y, brute_force(x, w, None, 2, normalize), rtol=2e-5, atol=2e-6)


def test_doc_offsets():
    seg = jnp.asarray([[3, 3, 3, 5, 5, 3, 3]])
    np.testing.assert_array_equal(doc_offsets(seg, 1, 7), [[0, 1, 2, 0, 1, 0, 1]])
    np.testing.assert_array_equal(doc_offsets(None, 1, 4), [[0, 1, 2, 3]])


# (B, T, C, heads, W, block_t, segments): T below, at and across tiles and not a multiple of
# one (first and last tiles shift their rows), W 4 / 3 / 2 (taps padded to 4 / 2), one head
# and several.
CASES = [
    (2, 75, 32, 2, 4, 16, True),
    (1, 130, 64, 4, 4, 64, False),
    (2, 48, 48, 3, 3, 16, True),
    (1, 10, 16, 1, 4, 16, False),
    (1, 33, 16, 1, 2, 16, True),
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize(
    "case",
    CASES,
    ids=[
        f"B{c[0]}-T{c[1]}-C{c[2]}-h{c[3]}-W{c[4]}-bt{c[5]}{'-seg' if c[6] else ''}" for c in CASES
    ],
)
def test_pallas_matches_reference(case, normalize, mode):
    B, T, C, heads, W, bt, segments = case
    x, w, seg, dy = make(B, T, C, W, seed=T, segments=segments)
    ref = value_and_grads(x, w, seg, dy, impl="reference", heads=heads, normalize=normalize)
    out = value_and_grads(x, w, seg, dy, impl=mode, heads=heads, normalize=normalize, block_t=bt)
    for name, a, b in zip(("y", "dx", "dw"), out, ref):
        assert rel(a, b) < 2e-6, (name, rel(a, b))


def test_pallas_bf16_within_bf16_noise():
    """bf16 inputs: the kernel sums in fp32 where the reference rounds each tap to bf16; both
    against the fp32 computation, the kernel is no worse than the reference."""
    x, w, seg, dy = make(2, 64, 32, seed=3)
    xb = x.astype(jnp.bfloat16)
    exact = value_and_grads(
        xb.astype(jnp.float32), w, seg, dy, impl="reference", heads=2, normalize=True
    )
    ref = value_and_grads(xb, w, seg, dy, impl="reference", heads=2, normalize=True)
    out = value_and_grads(xb, w, seg, dy, impl="interpret", heads=2, normalize=True, block_t=16)
    for name, o, r, e in zip(("y", "dx", "dw"), out, ref, exact):
        assert o.dtype == r.dtype, name
        assert rel(o, e) <= max(rel(r, e), 4e-3), (name, rel(o, e), rel(r, e))


@pytest.mark.parametrize("mode", MODES)
def test_scale_multiplies_the_normalised_output(mode):
    """scale c: y = c n, and the gradients are c times those of n; the kernels and the
    reference agree (c = 1/8 exactly as the GDN queries' K**-0.5 at K = 64, and another)."""
    x, w, seg, dy = make(2, 75, 32, seed=4)
    base = value_and_grads(x, w, seg, dy, impl="reference", heads=2, normalize=True)
    for c in (0.125, 0.3):
        ref = value_and_grads(x, w, seg, dy, impl="reference", heads=2, normalize=True, scale=c)
        out = value_and_grads(
            x, w, seg, dy, impl=mode, heads=2, normalize=True, block_t=16, scale=c
        )
        for name, o, r, b in zip(("y", "dx", "dw"), out, ref, base):
            assert rel(r, c * b) < 2e-6, (name, c)
            assert rel(o, r) < 2e-6, (name, c, rel(o, r))
    with pytest.raises(ValueError, match="scale=0.5 multiplies the normalised output"):
        short_conv(x, w, seg, scale=0.5)


def test_document_start_sees_only_itself():
    x, w, _, _ = make(1, 16, 16, segments=False)
    seg = jnp.asarray([[0] * 9 + [1] * 7])
    for impl in ("reference", "interpret"):
        y = value_and_grads(x, w, seg, jnp.zeros_like(x), impl=impl, heads=1, normalize=False)[0]
        np.testing.assert_allclose(y[0, 9], jax.nn.silu(w[-1] * x[0, 9]), rtol=1e-6)


def test_errors():
    x, w, seg, _ = make(1, 16, 16)
    with pytest.raises(ValueError, match="heads=3 does not divide the 16"):
        short_conv(x, w, heads=3)
    with pytest.raises(ValueError, match=r"segment_ids must be \[B,T\]"):
        short_conv(x, w, seg[:, :8])
    with pytest.raises(ValueError, match="weight"):
        short_conv(x, w[:, :8])
    with pytest.raises(ValueError, match="impl='bogus'"):
        ShortConvSettings(impl="bogus")
    with pytest.raises(ValueError, match="Triton .GPU. lowering only"):
        short_conv(x, w, settings=ShortConvSettings(impl="pallas", platform="cpu"))
    with pytest.raises(ValueError, match="4 taps reach 3 rows back, past a tile of 2"):
        short_conv_pallas(x, w, settings=ShortConvSettings(block_t=2, interpret=True))


def test_auto_takes_the_kernels_on_gpu_where_they_run():
    from kernels_pallas.short_conv.op import choose

    gpu = ShortConvSettings(platform="gpu")
    assert choose(gpu, 64) == "pallas"
    assert choose(gpu, 48) == choose(gpu, 8) == "reference"
    assert choose(gpu.replace(impl="pallas"), 48) == "pallas"  # asked for: its own error says why
    assert choose(ShortConvSettings(platform="tpu"), 64) == "reference"


@pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 devices (conftest's CPU devices)")
def test_pallas_per_shard_under_a_mesh():
    """Under ``kernel_mesh`` the kernel runs in a shard_map over batch rows and heads: same
    values and gradients as on one device."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from hwh_jax.training.sharding import make_mesh
    from kernels_pallas import kernel_mesh

    mesh = make_mesh((2, 2, 2))
    x, w, seg, dy = make(4, 40, 32, seed=5)

    def f(x, w, seg, dy):
        def loss(x, w):
            y = short_conv(
                x,
                w,
                seg,
                heads=4,
                normalize=True,
                settings=ShortConvSettings(impl="pallas", interpret=True),
            )
            return jnp.sum(y * dy)

        return jax.grad(loss, argnums=(0, 1))(x, w)

    ref = jax.jit(f)(x, w, seg, dy)
    rows = NamedSharding(mesh, P(("data", "fsdp")))
    args = [jax.device_put(a, rows) for a in (x, seg, dy)]
    with kernel_mesh(mesh):
        jaxpr = str(jax.make_jaxpr(f)(args[0], w, args[1], args[2]))
        out = jax.jit(f)(args[0], w, args[1], args[2])
    assert "shard_map" in jaxpr and "f32[1,64,16]" in jaxpr  # 1 row, T padded, 2 of 4 heads
    for a, b in zip(out, ref):
        assert rel(a, b) < 1e-6
