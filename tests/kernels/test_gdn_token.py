"""A GDN layer's decode token as one kernel (``kernels_pallas.gdn.token``), interpreted: against
its jnp form, and inside a model against the layer's separate ops (convolution, norms, gates,
step, gated norm), with left padding, with and without the decay."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import kernels_pallas
from hwh_jax.models import HybridLM, model_config
from kernels_pallas import GDNSettings, ShortConvSettings
from kernels_pallas.gdn import gated_delta_rule_token, token_kernel_runs
from kernels_pallas.gdn.token import token_pallas, token_reference


def inputs(B, n, K, V, W, seed=0):
    ks = jax.random.split(jax.random.key(seed), 9)
    C = n * (2 * K + V)
    return dict(
        xp=jax.random.normal(ks[0], (B, W, C)),
        conv_w=0.5 * jax.random.normal(ks[1], (W, C)),
        a=jax.random.normal(ks[2], (B, n)),
        b=jax.random.normal(ks[3], (B, n)),
        gate=jax.random.normal(ks[4], (B, n * V)),
        a_log=jax.random.uniform(ks[5], (n,), maxval=2.7),
        dt_bias=jax.random.normal(ks[6], (n,)),
        norm_w=jax.random.normal(ks[7], (V,)),
        valid=jnp.arange(B) != 1,
        state=jax.random.normal(ks[8], (B, n, K, V)),
    )


def written_out(xs, decay=True):
    """The jnp form by hand, one row and head at a time, from the formulas."""
    x = {k: np.asarray(v, np.float64) for k, v in xs.items()}
    B, W, C = x["xp"].shape
    n, K, V = x["state"].shape[1:]
    outs, states = np.zeros((B, n * V)), np.zeros(x["state"].shape)
    silu = lambda z: z / (1 + np.exp(-z))
    for i in range(B):
        s = silu((x["xp"][i] * x["conv_w"]).sum(0))
        for h in range(n):
            q = s[h * K : (h + 1) * K]
            k = s[n * K + h * K : n * K + (h + 1) * K]
            v = s[2 * n * K + h * V : 2 * n * K + (h + 1) * V]
            q = q / np.sqrt((q * q).sum() + 1e-6) * K**-0.5
            k = k / np.sqrt((k * k).sum() + 1e-6)
            m = float(x["valid"][i])
            beta = m / (1 + np.exp(-x["b"][i, h]))
            S = x["state"][i, h]
            if decay:
                g = -np.exp(x["a_log"][h]) * np.log1p(np.exp(x["a"][i, h] + x["dt_bias"][h])) * m
                S = S * np.exp(g)
            S = S + np.outer(k, beta * (v - S.T @ k))
            o = S.T @ q
            gt = x["gate"][i, h * V : (h + 1) * V]
            outs[i, h * V : (h + 1) * V] = (
                o / np.sqrt((o * o).mean() + 1e-6) * x["norm_w"] * silu(gt)
            )
            states[i, h] = S
    return outs, states


@pytest.mark.parametrize("decay", [True, False])
def test_kernel_and_jnp_form_match_the_formulas(decay):
    B, n, K, V, W = 3, 4, 16, 32, 4
    xs = inputs(B, n, K, V, W)
    if not decay:
        xs.update(a=None, a_log=None, dt_bias=None)
    want_o, want_s = written_out({k: v for k, v in xs.items() if v is not None}, decay)
    kw = dict(heads=n, scale=K**-0.5)
    for fn in (token_reference, lambda *a, **k: token_pallas(*a, **k, interpret=True)):
        o, s = fn(*xs.values(), **kw)
        assert o.dtype == jnp.float32 and s.dtype == jnp.float32
        np.testing.assert_allclose(np.asarray(o), want_o, rtol=2e-5, atol=2e-5)
        np.testing.assert_allclose(np.asarray(s), want_s, rtol=2e-5, atol=2e-5)
    # the padded row's state is untouched
    np.testing.assert_array_equal(np.asarray(s[1]), np.asarray(xs["state"][1]))


def test_the_op_runs_the_kernel_only_where_it_can():
    xs = inputs(2, 2, 16, 16, 4)
    on = GDNSettings(impl="pallas", interpret=True)
    gated_delta_rule_token(*xs.values(), heads=2, scale=0.25, settings=on)
    assert kernels_pallas.chosen()["gated_delta_rule_token@cpu"] == "pallas"
    for settings in (on.replace(token_kernel=False), GDNSettings(), on.replace(impl="recurrent")):
        gated_delta_rule_token(*xs.values(), heads=2, scale=0.25, settings=settings)
        assert kernels_pallas.chosen()["gated_delta_rule_token@cpu"] == "reference"
    assert not token_kernel_runs(on, 3, 2, 16, 16)  # a width of 3 taps: no Triton block
    assert not token_kernel_runs(on, 4, 2, 12, 16)
    assert token_kernel_runs(on, 4, 2, 16, 16)


@pytest.mark.parametrize("kind", ["gdn", "deltanet"])
def test_model_decode_with_the_token_kernel_matches_the_separate_ops(kind):
    """A tiny HwH (fp32) prefills left-padded prompts and decodes 4 tokens with the token
    kernel (interpreted) and with the layer's separate ops: logits and caches agree."""
    pallas = dict(impl="pallas", interpret=True)
    runs = []
    for token_kernel in (True, False):
        cfg = model_config(
            "hwh",
            "tiny",
            dtype="float32",
            la_kind=kind,
            gdn=GDNSettings(**pallas, token_kernel=token_kernel, step_min_programs=1),
            conv=ShortConvSettings(**pallas),
        )
        model = HybridLM(cfg, rngs=nnx.Rngs(0))
        cache = model.init_cache(2, 16, start=jnp.array([0, 3]))
        rng = np.random.default_rng(1)
        prompt = jnp.asarray(rng.integers(0, cfg.vocab_size, (2, 6)), jnp.int32)
        logits, cache = model.extend(prompt, cache)
        outs = [logits]
        tok = jnp.argmax(logits[:, -1:], -1).astype(jnp.int32)
        for _ in range(4):
            logits, cache = model.extend(tok, cache)
            outs.append(logits)
            tok = jnp.argmax(logits, -1).astype(jnp.int32)
        runs.append((outs, cache))
        if token_kernel:
            assert kernels_pallas.chosen()["gated_delta_rule_token@cpu"] == "pallas"
    (a, ca), (b, cb) = runs
    for x, y in zip(a, b):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-4, atol=1e-4)
    for x, y in zip(jax.tree.leaves(ca), jax.tree.leaves(cb)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-4, atol=1e-4)


ON_GPU = jax.default_backend() == "gpu"


@pytest.mark.skipif(not ON_GPU, reason="compiled: needs a GPU")
@pytest.mark.parametrize("B, n", [(1, 13), (32, 16)])
def test_compiled_kernel_matches_the_jnp_form(B, n):
    """On a GPU, bf16 inputs at HwH-380m's decode shapes: the compiled kernel against the jnp
    form on the same inputs (both fp32 inside)."""
    xs = inputs(B, n, 64, 64, 4, seed=B)
    for key in ("xp", "a", "b", "gate"):
        xs[key] = xs[key].astype(jnp.bfloat16)
    want_o, want_s = jax.jit(token_reference, static_argnames=("heads", "scale"))(
        *xs.values(), heads=n, scale=0.125
    )
    o, s = token_pallas(*xs.values(), heads=n, scale=0.125)
    assert o.dtype == jnp.bfloat16
    err = lambda a, b: float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b))
    assert err(s, want_s) < 1e-5
    assert err(o.astype(jnp.float32), want_o.astype(jnp.float32)) < 1e-2
