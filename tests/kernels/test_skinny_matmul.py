"""kernels_pallas.skinny_matmul (a product of a few rows by a matrix: a decode step's
projections): the kernel (generic interpreter on CPU; compiled as well on a GPU backend) against
an fp64 product and XLA's, its plan, its gradient, the op's dispatch, and a decode step of the
model through it against the same step through XLA."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from kernels_pallas import chosen
from kernels_pallas.skinny_matmul import (
    SkinnyMatmulSettings,
    plan,
    skinny_matmul,
    skinny_matmul_reference,
)

MODES = ["interpret"] + (["compiled"] if jax.default_backend() == "gpu" else [])


def settings(mode, max_rows=32, **kw):
    return SkinnyMatmulSettings(
        impl="pallas", interpret=mode == "interpret", max_rows=max_rows, **kw
    )


def make(M, K, N, dtype, seed=0):
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.standard_normal((M, K)), dtype)
    w = jnp.asarray(rng.standard_normal((K, N)) / np.sqrt(K), dtype)
    return x, w


# rows: one (CUDA cores), an odd count (padded to 4), 16 and 32 (tensor cores); K: a power of
# two, 43 x 64 (HwH-380m's MLP width: K split unevenly), 11 x 16 (16-row tiles); N: columns
# past the last full block (masked)
SHAPES = [(1, 1024, 200), (3, 176, 64), (16, 2752, 72), (32, 256, 130), (1, 2752, 1000)]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("M,K,N", SHAPES)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_kernel_matches_the_fp64_product_as_xla_does(mode, M, K, N, dtype):
    x, w = make(M, K, N, dtype)
    y = skinny_matmul(x, w, settings=settings(mode))
    assert y.shape == (M, N) and y.dtype == dtype
    exact = np.asarray(x, np.float64) @ np.asarray(w, np.float64)
    err = np.max(np.abs(np.asarray(y, np.float64) - exact))
    xla = np.max(np.abs(np.asarray(skinny_matmul_reference(x, w), np.float64) - exact))
    # fp32: both accumulate in fp32; bf16: both round the fp32 sum once to bf16
    tol = 1e-5 if dtype == jnp.float32 else 2 * max(xla, 2**-8 * np.max(np.abs(exact)))
    assert err <= tol, (err, xla)


def test_plan_splits_k_until_the_programs_fill_the_device_and_no_further():
    s = SkinnyMatmulSettings(max_rows=32)  # block_n 64, 256 programs
    p = plan(1, 1024, 1024, s)  # 16 column blocks, 16 tiles of 64 rows
    assert (p.rows, p.block_k, p.splits) == (1, 64, 16)
    # 32 rows: the fp32 partial sums (4 x splits x 32 x N bytes) at most half of w's 2 K N
    assert plan(32, 1024, 1024, s).splits == 8
    assert plan(1, 2752, 1024, s).splits == 16  # 43 tiles: splits of 2 or 3 tiles
    assert plan(1, 1024, 16384, s).splits == 1  # 256 column blocks already
    assert plan(5, 1024, 64, s).rows == 8
    assert plan(33, 1024, 64, s) is None and plan(1, 1000, 64, s) is None
    assert plan(64, 1024, 64, s.replace(max_rows=64)).rows == 64
    assert plan(2, 1024, 64, SkinnyMatmulSettings()) is None  # the default: one row only


@pytest.mark.parametrize("mode", MODES)
def test_gradients_are_the_products_of_the_cotangent(mode):
    x, w = make(2, 128, 96, jnp.float32, seed=1)
    dy = jnp.asarray(np.random.default_rng(2).standard_normal((2, 96)), jnp.float32)

    def grads(fn):
        return jax.vjp(fn, x, w)[1](dy)

    got = grads(lambda x, w: skinny_matmul(x, w, settings=settings(mode)))
    want = grads(skinny_matmul_reference)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_dispatch_names_what_runs():
    x, w = make(4, 64, 32, jnp.float32)
    skinny_matmul(x, w, settings=SkinnyMatmulSettings(impl="pallas"))  # CPU, not interpreted
    assert chosen()["skinny_matmul@cpu"] == "reference"
    skinny_matmul(x, w, settings=settings("interpret"))
    assert chosen()["skinny_matmul@cpu"] == "pallas"
    many, _ = make(64, 64, 32, jnp.float32)
    np.testing.assert_allclose(
        skinny_matmul(many, w, settings=settings("interpret")),
        skinny_matmul_reference(many, w),
        rtol=1e-6,
    )
    assert chosen()["skinny_matmul@cpu"] == "reference"  # above max_rows
    skinny_matmul(x, w, settings=settings("interpret", max_rows=1))
    assert chosen()["skinny_matmul@cpu"] == "reference"
    with pytest.raises(ValueError, match=r"x \[..., K\] and w \[K, N\]"):
        skinny_matmul(x, w.T)


@pytest.mark.parametrize(
    "field,value", [("block_n", 48), ("block_k", 8), ("max_rows", 0), ("min_programs", 0)]
)
def test_settings_refuse_bad_values_by_name(field, value):
    with pytest.raises(ValueError, match=field):
        SkinnyMatmulSettings(**{field: value})


def test_decode_steps_through_the_kernel_match_xla():
    """Three greedy decode tokens of HwH-tiny at batch 2 with every product of the step (the
    mixers' fused inputs, o_proj, the MLP) through the interpreted kernel: XLA's logits and
    cache."""
    from hwh_jax.models import HybridLM, model_config

    cfg = model_config("hwh", "tiny", dtype="float32")
    model = HybridLM(cfg, rngs=nnx.Rngs(0))
    fast = HybridLM(cfg, rngs=nnx.Rngs(0))
    n = 0
    for _, m in nnx.iter_graph(fast):
        if isinstance(m, nnx.Module) and getattr(m, "matmul_settings", None) is not None:
            m.matmul_settings = settings("interpret")
            n += 1
    assert n == 2 * cfg.num_layers  # each layer's mixer and MLP
    tok = jnp.array([[3], [5]], jnp.int32)
    ca, cb = model.init_cache(2, 8), fast.init_cache(2, 8)
    for _ in range(3):
        a, ca = model.extend(tok, ca)
        b, cb = fast.extend(tok, cb)
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)
        tok = jnp.argmax(a[:, -1], axis=-1)[:, None].astype(jnp.int32)
    for x, y in zip(jax.tree.leaves(ca), jax.tree.leaves(cb)):
        np.testing.assert_allclose(y, x, rtol=1e-5, atol=1e-5)


def test_linear_matmul_takes_the_kernel_where_its_settings_choose_it_and_says_so():
    from hwh_jax.layers.linear import dot_last, matmul

    x, w = make(4, 64, 32, jnp.float32, seed=3)
    np.testing.assert_allclose(matmul(x, w, settings("interpret")), dot_last(x, w), rtol=1e-6)
    assert chosen()["skinny_matmul@cpu"] == "pallas"
    np.testing.assert_array_equal(matmul(x, w, settings("interpret", max_rows=1)), dot_last(x, w))
    assert chosen()["skinny_matmul@cpu"] == "reference"
