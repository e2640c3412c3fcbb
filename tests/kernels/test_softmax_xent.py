"""kernels_pallas.softmax_xent (nll, logZ and the logits' gradient in one pass) and
layers.loss.head_loss (the LM head and loss as one op): the reference against autodiff and optax,
the Pallas kernel (generic interpreter on CPU; compiled as well on a GPU backend) against the
reference, the op under a device mesh, head_loss against autodiff of the unfused loss, and the
model's loss with each ``loss_impl``."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from kernels_pallas.softmax_xent import SoftmaxXentSettings, softmax_xent
from kernels_pallas.softmax_xent.op import choose
from kernels_pallas.softmax_xent.pallas import chunks

REFERENCE = SoftmaxXentSettings(impl="reference")

MODES = ["interpret"] + (["compiled"] if jax.default_backend() == "gpu" else [])


def make(n, v, dtype, seed=0):
    rng = np.random.default_rng(seed)
    logits = jnp.asarray(rng.standard_normal((n, v)) * rng.uniform(0.5, 8, (n, 1)), dtype)
    targets = jnp.asarray(rng.integers(0, v, n), jnp.int32)
    a = jnp.asarray(rng.uniform(0, 1, n) * (rng.uniform(0, 1, n) > 0.2), jnp.float32)
    b = jnp.asarray(rng.uniform(0, 0.1, n), jnp.float32)
    return logits, targets, a, b


def close(x, y, tol):
    x, y = np.asarray(x, np.float32), np.asarray(y, np.float32)
    np.testing.assert_allclose(x, y, rtol=tol, atol=tol * np.abs(y).max())


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_reference_matches_optax_and_autodiff(dtype):
    """nll is optax's integer-label cross entropy, logZ jax's logsumexp, and d the gradient of
    sum(a nll + b logZ^2 / 2) by autodiff (rounded to the logits' dtype)."""
    logits, targets, a, b = make(12, 80, dtype)
    nll, logz, d = softmax_xent(logits, targets, a, b, settings=REFERENCE)
    l32 = logits.astype(jnp.float32)
    close(nll, optax.softmax_cross_entropy_with_integer_labels(l32, targets), 1e-6)
    close(logz, jax.nn.logsumexp(l32, axis=-1), 1e-6)

    def total(l):
        lz = jax.nn.logsumexp(l, axis=-1)
        return jnp.sum(
            a * optax.softmax_cross_entropy_with_integer_labels(l, targets) + 0.5 * b * lz * lz
        )

    want = jax.grad(total)(l32)
    assert d.dtype == logits.dtype and d.shape == logits.shape
    close(d, want, 1e-6 if dtype == "float32" else 1e-2)
    assert np.abs(np.asarray(d, np.float32)).max() > 0


def test_chunks_cover_the_row_with_aligned_power_of_two_widths():
    assert chunks(50304, 4096) == ((0, 4096, 12), (49152, 1024, 1), (50176, 128, 1))
    assert chunks(400, 256) == ((0, 256, 1), (256, 128, 1), (384, 16, 1))
    for v, bv in ((50304, 2048), (4096, 4096), (48, 256), (1008, 64)):
        cs = chunks(v, bv)
        assert sum(w * n for _, w, n in cs) == v
        assert all(s % w == 0 and w & (w - 1) == 0 for s, w, _ in cs)
        assert [s for s, _, _ in cs] == [sum(w * n for _, w, n in cs[:i]) for i in range(len(cs))]
    with pytest.raises(ValueError, match="multiple of 16, got 50257"):
        chunks(50257, 4096)
    with pytest.raises(ValueError, match="power of two >= 16, got 3000"):
        chunks(50304, 3000)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("n,v,block_v", [(8, 400, 256), (6, 1024, 128), (16, 48, 4096)])
def test_pallas_matches_reference(n, v, block_v, dtype, mode):
    """Chunk widths of several sizes per row, several rows per program (and one, n = 6 with
    128 columns a chunk), a vocabulary below block_v."""
    logits, targets, a, b = make(n, v, dtype, seed=n)
    want = softmax_xent(logits, targets, a, b, settings=REFERENCE)
    got = softmax_xent(
        logits,
        targets,
        a,
        b,
        settings=SoftmaxXentSettings(
            impl="pallas", interpret=(mode == "interpret"), block_v=block_v
        ),
    )
    for x, y, tol in zip(got, want, (1e-5, 1e-5, 1e-5 if dtype == "float32" else 1e-2)):
        assert x.dtype == y.dtype and x.shape == y.shape
        close(x, y, tol)


def test_errors_and_dispatch():
    logits, targets, a, b = make(4, 32, "float32")
    with pytest.raises(ValueError, match=r"targets \[N\], got \(4, 32\) and \(3,\)"):
        softmax_xent(logits, targets[:3], a, b)
    with pytest.raises(ValueError, match=r"b must be \[4\], got \(4, 1\)"):
        softmax_xent(logits, targets, a, b[:, None])
    with pytest.raises(ValueError, match="impl='bogus'"):
        SoftmaxXentSettings(impl="bogus")
    with pytest.raises(ValueError, match="multiple of 16, got 40"):
        softmax_xent(
            jnp.ones((4, 40)),
            targets,
            a,
            b,
            settings=SoftmaxXentSettings(impl="pallas", interpret=True),
        )
    assert choose(SoftmaxXentSettings(platform="cpu"), 50304) == "reference"
    assert choose(SoftmaxXentSettings(platform="gpu"), 50304) == "pallas"
    assert choose(SoftmaxXentSettings(platform="gpu"), 50257) == "reference"


@pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 devices (conftest's CPU devices)")
def test_pallas_per_shard_under_a_mesh():
    """Under ``kernel_mesh``: a shard_map over rows, the same values as on one device; with the
    vocabulary split over a tensor axis, ``auto`` takes the reference."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from hwh_jax.training.sharding import make_mesh
    from kernels_pallas import kernel_mesh

    logits, targets, a, b = make(16, 64, "float32", seed=3)
    kernel = SoftmaxXentSettings(impl="pallas", interpret=True, block_v=32)
    f = lambda *x: softmax_xent(*x, settings=kernel)
    want = jax.jit(f)(logits, targets, a, b)
    mesh = make_mesh((4, 1, 2))
    rows = NamedSharding(mesh, P("data"))
    args = [jax.device_put(x, rows) for x in (logits, targets, a, b)]
    with kernel_mesh(mesh):
        jaxpr = str(jax.make_jaxpr(f)(*args))
        got = jax.jit(f)(*args)
        gpu = SoftmaxXentSettings(platform="gpu")
        assert choose(gpu, 64) == "reference"  # split over tensor = 2
    with kernel_mesh(make_mesh((4, 2, 1))):
        assert choose(gpu, 64) == "pallas"  # rows split, vocabulary whole
    assert "shard_map" in jaxpr and "f32[4,64]" in jaxpr  # 4 rows a shard
    for x, y in zip(got, want):
        close(x, y, 1e-6)


def _unfused(h, w, targets, mask, z_loss):
    from hwh_jax.layers.loss import cross_entropy

    loss, zl, count = cross_entropy(jnp.einsum("btd,dv->btv", h, w), targets, mask, z_loss)
    return loss + zl, (loss, zl, count)


@pytest.mark.parametrize("impl", ["reference", "pallas"])
@pytest.mark.parametrize("z_loss", [0.0, 0.05])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_head_loss_matches_autodiff_of_the_unfused_loss(dtype, z_loss, impl):
    """Values (total, loss, z-loss term, tokens) and gradients for h and w as autodiff of
    cross_entropy(h @ w); a cotangent of 3 scales the gradients."""
    from hwh_jax.layers.loss import head_loss

    rng = np.random.default_rng(5)
    h = jnp.asarray(rng.standard_normal((2, 6, 16)), dtype)
    w = jnp.asarray(rng.standard_normal((16, 96)) * 0.5, dtype)
    targets = jnp.asarray(rng.integers(0, 96, (2, 6)), jnp.int32)
    mask = jnp.asarray(rng.uniform(0, 1, (2, 6)) > 0.3, jnp.float32)

    def fused(h, w):
        total, loss, zl, count = head_loss(
            h,
            w,
            targets,
            mask,
            z_loss=z_loss,
            settings=SoftmaxXentSettings(impl=impl, interpret=True, block_v=64),
        )
        return 3 * total, (loss, zl, count)

    def plain(h, w):
        total, aux = _unfused(h, w, targets, mask, z_loss)
        return 3 * total, aux

    (t1, aux1), g1 = jax.value_and_grad(fused, argnums=(0, 1), has_aux=True)(h, w)
    (t2, aux2), g2 = jax.value_and_grad(plain, argnums=(0, 1), has_aux=True)(h, w)
    tol = 1e-5 if dtype == "float32" else 2e-2
    for x, y in zip((t1, *aux1), (t2, *aux2)):
        close(x, y, tol)
    for x, y in zip(g1, g2):
        assert x.dtype == y.dtype and x.shape == y.shape
        close(x, y, tol)
        assert np.abs(np.asarray(x, np.float32)).max() > 0
    with pytest.raises(ValueError, match="head_loss: h"):
        head_loss(h, w[:8], targets, mask)


def test_train_loss_with_each_loss_impl_matches_unfused():
    """The tiny model's training loss and every parameter's gradient with head_loss (the
    reference; on a GPU the kernel too) against the unfused loss, tied and untied heads. (The
    Transformer: the loss takes the final hidden states whatever the mixer; it compiles
    fastest.)"""
    from flax import nnx

    from hwh_jax.models import HybridLM, model_config
    from hwh_jax.training.steps import train_loss

    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(0, 512, (2, 33)), jnp.int32)
    batch = {
        "inputs": tokens[:, :-1],
        "targets": tokens[:, 1:],
        "loss_mask": jnp.asarray(rng.uniform(0, 1, (2, 32)) > 0.1, jnp.float32),
    }
    fused = ["reference"] + (["pallas"] if jax.default_backend() == "gpu" else [])
    for tie in (True, False):
        out = {}
        for impl in ["unfused"] + fused:
            cfg = model_config(
                "transformer", "tiny", vocab_size=512, tie_embeddings=tie, dtype="float32"
            )
            graphdef, params = nnx.split(HybridLM(cfg, rngs=nnx.Rngs(0)), nnx.Param)
            out[impl] = jax.jit(
                jax.value_and_grad(
                    lambda p: train_loss(graphdef, p, batch, loss_impl=impl, z_loss=1e-3),
                    has_aux=True,
                )
            )(params)
        (t0, (l0, n0)), g0 = out["unfused"]
        for impl in fused:
            (t, (l, n)), g = out[impl]
            close(t, t0, 1e-6)
            close(l, l0, 1e-6)
            assert float(n) == float(n0) and float(t) > float(l) > 0
            for x, y in zip(jax.tree.leaves(g), jax.tree.leaves(g0)):
                close(x, y, 1e-5)
    with pytest.raises(ValueError, match="loss_impl must be one of .*got 'fused'"):
        train_loss(graphdef, params, batch, loss_impl="fused")
