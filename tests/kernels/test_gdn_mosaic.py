"""GDN's WY apply on Mosaic GPU (``GDNSettings(wy_apply="mosaic")``): its w, u and QK against
the formulas in fp32 and against the Triton kernel, the whole op against the Triton path, its
CUDA lowering, the shapes it refuses, and where ``wy_apply="auto"`` takes it.

On CPU the kernel runs under the Mosaic GPU interpreter (where this JAX has one), which checks
its data flow but models neither layouts nor swizzling nor the transposed operand of QK's
product (``wy_apply_mosaic``'s docstring); lowering it for CUDA checks those without a GPU.
On a GPU (``JAX_PLATFORMS=cuda``: the suite's conftest sets cpu otherwise; ``bash
bench/tables.sh OUT compiled``) the kernel runs compiled.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu

from kernels_pallas.gdn import GDNSettings, gated_delta_rule
from kernels_pallas.gdn.wy_apply_mosaic import interpreter, wy_apply_mosaic
from kernels_pallas.gdn.wy_kernels import wy_forward
from kernels_pallas.linear_scan.common import kernel_config

needs_interpreter = pytest.mark.skipif(
    interpreter() is None, reason=f"JAX {jax.__version__} has no Mosaic GPU interpreter"
)
C = 64
ON_GPU = jax.default_backend() == "gpu"


def inputs(B, T, H, K, V, decay=True, seed=0):
    ks = jax.random.split(jax.random.key(seed), 6)
    bf = jnp.bfloat16
    q, k = (jax.random.normal(kk, (B, T, H, K)).astype(bf) for kk in ks[:2])
    v = jax.random.normal(ks[2], (B, T, H, V)).astype(bf)
    beta = jax.nn.sigmoid(jax.random.normal(ks[3], (B, T, H)))
    g = jax.nn.log_sigmoid(jax.random.normal(ks[4], (B, T // C, C, H)) + 3)
    G = jnp.cumsum(g, 2).reshape(B, T, H) if decay else None
    X = jnp.tril(jax.random.normal(ks[5], (B, T, H, C)) * 0.1).astype(bf)
    return q, k, v, beta, G, X


def formulas(q, k, v, beta, G, X, q_scale):
    """w, u, QK of every chunk in fp32 (the module docstring of ``wy_kernels``)."""
    B, T, H, K = k.shape
    chunks = lambda a: a.astype(jnp.float32).reshape(B, T // C, C, H, -1)
    qc, kc, vc, Xc, bc = chunks(q), chunks(k), chunks(v), chunks(X), chunks(beta[..., None])
    gc = jnp.zeros_like(bc) if G is None else chunks(G[..., None])
    w = jnp.einsum("bnihj,bnjhk->bnihk", Xc, bc * jnp.exp(gc) * kc)
    u = jnp.einsum("bnihj,bnjhk->bnihk", Xc, bc * vc)
    s = jnp.einsum("bnihk,bnjhk->bnihj", qc, kc)
    gi = gc[..., 0]  # [B, N, C, H]
    diff = gi[..., None] - jnp.moveaxis(gi, 2, 3)[:, :, None]  # [B, N, C(i), H, C(j)]
    causal = jnp.tril(jnp.ones((C, C), bool))[None, None, :, None, :]
    qk = s * jnp.where(causal, jnp.exp(diff), 0.0) * q_scale
    flat = lambda a: a.reshape(B, T, H, -1)
    return flat(w), flat(u), flat(qk)


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@needs_interpreter
@pytest.mark.parametrize(
    "shape,decay",
    [
        ((1, 512, 2, 64, 64), True),  # 8 chunks a CTA
        ((2, 192, 1, 128, 64), True),  # 1 chunk a CTA
        ((1, 256, 1, 64, 128), False),
    ],
    ids=["K64-V64", "K128-V64-odd-chunks", "V128-no-decay"],
)
def test_mosaic_apply_matches_the_formulas_and_the_triton_kernel(shape, decay):
    """bf16 inputs: w, u, QK within bf16 rounding of the fp32 formulas, and of the Triton
    kernel's (interpreted), which rounds its scaled operand on the other side of X."""
    q, k, v, beta, G, X = inputs(*shape, decay=decay)
    got = wy_apply_mosaic(q, k, v, beta, G, X, q_scale=0.125, interpret=True)
    want = formulas(q, k, v, beta, G, X, 0.125)
    B, T, H, K = k.shape
    cfg = kernel_config(GDNSettings(interpret=True), B, H, K, v.shape[-1])
    triton = wy_forward(cfg, q, k, v, beta, G, X, q_scale=0.125)[:3]
    for name, a, b, t in zip(("w", "u", "qk"), got, want, triton):
        assert a.shape == b.shape and a.dtype == jnp.bfloat16, name
        assert rel(a, b) < 6e-3, (name, rel(a, b))
        assert rel(a, t) < 1e-2, (name, rel(a, t))


@pytest.mark.skipif(
    not ON_GPU and interpreter() is None,
    reason=f"JAX {jax.__version__} has no Mosaic GPU interpreter",
)
def test_gdn_with_the_mosaic_apply_matches_the_triton_path():
    """The whole op (forward and every gradient) with wy_apply="mosaic" against "triton", both
    compiled on a GPU, else both interpreted, on bf16 inputs: the backward reads the w and QK
    the forward saved."""
    B, T, H, K, V = 1, 128, 2, 64, 64
    q, k, v, _, _, _ = inputs(B, T, H, K, V, seed=1)
    ks = jax.random.split(jax.random.key(2), 3)
    g = jax.nn.log_sigmoid(jax.random.normal(ks[0], (B, T, H)) + 3)
    beta = jax.nn.sigmoid(jax.random.normal(ks[1], (B, T, H))).astype(jnp.bfloat16)
    do = jax.random.normal(ks[2], (B, T, H, V))
    q = q * (K**-0.5)
    k = (
        k.astype(jnp.float32) / jnp.linalg.norm(k.astype(jnp.float32), axis=-1, keepdims=True)
    ).astype(jnp.bfloat16)
    res = []
    for apply in ("triton", "mosaic"):
        settings = GDNSettings(impl="pallas", interpret=not ON_GPU, wy_apply=apply)

        def loss(q, k, v, g, beta, settings=settings):
            o, _ = gated_delta_rule(q, k, v, g, beta, settings=settings)
            return jnp.sum(o.astype(jnp.float32) * do), o

        grads, o = jax.grad(loss, argnums=(0, 1, 2, 3, 4), has_aux=True)(q, k, v, g, beta)
        res.append((o,) + grads)
    for name, a, b in zip(("o", "dq", "dk", "dv", "dg", "dbeta"), *res):
        assert rel(a, b) < 2e-2, (name, rel(a, b))


@pytest.mark.skipif(not ON_GPU, reason="compiled: needs a (Hopper) GPU")
@pytest.mark.parametrize("shape", [(2, 512, 3, 64, 64), (1, 256, 2, 128, 128)], ids=["K64", "K128"])
def test_compiled_mosaic_apply_matches_the_formulas(shape):
    """On a GPU: the compiled kernel (swizzled tiles, layouts, wgmma with k^T) against the fp32
    formulas."""
    q, k, v, beta, G, X = inputs(*shape)
    got = jax.jit(lambda *a: wy_apply_mosaic(*a, q_scale=0.125))(q, k, v, beta, G, X)
    for name, a, b in zip(("w", "u", "qk"), got, formulas(q, k, v, beta, G, X, 0.125)):
        assert rel(a, b) < 6e-3, (name, rel(a, b))


def test_mosaic_apply_lowers_for_cuda():
    """Lowered for CUDA on any host (layouts, swizzled tiles, the transposed operand and the
    TMA copies are checked here, not by the interpreter): one Mosaic GPU call."""
    q, k, v, beta, G, X = inputs(1, 256, 2, 64, 64)
    f = jax.jit(lambda *a: wy_apply_mosaic(*a, q_scale=0.125))
    text = f.trace(q, k, v, beta, G, X).lower(lowering_platforms=("cuda",)).as_text()
    assert text.count("mosaic_gpu") >= 1


@pytest.mark.parametrize(
    "kw,shape,match",
    [
        ({"chunk_size": 32}, (1, 64, 1, 64, 64), "needs chunk_size=64, got 32"),
        ({}, (1, 64, 1, 32, 64), "needs K a multiple of 64, got 32"),
        ({}, (1, 64, 1, 64, 96), "needs V a multiple of 64, got 96"),
        ({"dtype": jnp.float32}, (1, 64, 1, 64, 64), "takes 16-bit inputs"),
        ({"interpret": pltpu.InterpretParams()}, (1, 64, 1, 64, 64), "is a GPU kernel"),
    ],
)
def test_mosaic_apply_refuses_what_it_does_not_take(kw, shape, match):
    """Errors name the value and the setting (checked before any kernel runs)."""
    kw = dict(kw)
    dtype = kw.pop("dtype", jnp.bfloat16)
    settings = GDNSettings(
        impl="pallas", wy_apply="mosaic", interpret=kw.pop("interpret", True), **kw
    )
    B, T, H, K, V = shape
    q, k = jnp.ones((B, T, H, K), dtype), jnp.ones((B, T, H, K), dtype)
    v, g, beta = jnp.ones((B, T, H, V), dtype), jnp.zeros((B, T, H)), jnp.ones((B, T, H))
    with pytest.raises(ValueError, match=match):
        gated_delta_rule(q, k, v, g, beta, settings=settings)
    with pytest.raises(ValueError, match="wy_apply must be one of"):
        GDNSettings(wy_apply="cuda")


@pytest.mark.parametrize(
    "hopper,platform,interpret,K,dtype,want",
    [
        (True, "gpu", False, 128, jnp.bfloat16, "mosaic"),
        (True, "gpu", False, 96, jnp.bfloat16, "triton"),  # K not a multiple of 64
        (True, "gpu", False, 128, jnp.float32, "triton"),  # not 16-bit
        (True, "gpu", True, 128, jnp.bfloat16, "triton"),  # interpreted
        (True, "tpu", False, 128, jnp.bfloat16, "triton"),  # compiled for another platform
        (False, "gpu", False, 128, jnp.bfloat16, "triton"),
    ],
)  # not a Hopper GPU
def test_auto_takes_the_mosaic_apply_only_where_it_runs_compiled(
    monkeypatch, hopper, platform, interpret, K, dtype, want
):
    """wy_apply="auto" (the default): Mosaic GPU on a Hopper GPU for the shapes it takes, the
    Triton kernel everywhere else; explicit values are kept."""
    from kernels_pallas.gdn import pallas, wy_apply_mosaic

    monkeypatch.setattr(wy_apply_mosaic, "hopper", lambda: hopper)
    settings = GDNSettings(platform=platform, interpret=interpret)
    assert settings.wy_apply == "auto"
    assert pallas.wy_apply(settings, K, 64, dtype) == want
    for fixed in ("triton", "mosaic"):
        assert pallas.wy_apply(settings.replace(wy_apply=fixed), K, 64, dtype) == fixed


def test_hopper_is_false_off_a_gpu():
    from kernels_pallas.gdn import wy_apply_mosaic

    assert wy_apply_mosaic.hopper() is (
        jax.devices()[0].platform == "gpu" and jax.devices()[0].compute_capability == "9.0"
    )
