"""Causality of every architecture and every linear-head kind: tokens changed from a position p
on (in one row of two) move no logit before p, nor any logit of the other row, nor the gradient
of the loss over the targets that did not change; at initialisation and with every weight
perturbed (a path whose weights start at zero cannot leak at init). The Pallas kernels run in
the interpreter where the CPU can run them. bench/causality.py runs the same check on a device
at the real sizes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from hwh_jax.layers import heads
from hwh_jax.models import ARCHS, HybridLM, model_config
from hwh_jax.training.steps import train_loss
from kernels_pallas import DecaySettings, GatedRecurrenceSettings, GDNSettings, ShortConvSettings

B, T, P, CHUNK = 2, 48, 21, 16  # p is no multiple of the chunk (16) or the window (8)
PALLAS = dict(impl="pallas", interpret=True)
CASES = {
    **{arch: ("tiny", arch, {}) for arch in ARCHS},
    **{f"hwh_{k}": ("tiny", "hwh", {"la_kind": k}) for k in heads.names() if k != "gdn"},
    # the Pallas kernels (the GPU's, interpreted)
    "hwh_pallas": (
        "tiny",
        "hwh",
        {"gdn": GDNSettings(**PALLAS), "conv": ShortConvSettings(**PALLAS)},
    ),
    "hwh_lightning_pallas": (
        "tiny",
        "hwh",
        {"la_kind": "lightning", "decay": DecaySettings(**PALLAS)},
    ),
    "hwh_gla_pallas": ("tiny", "hwh", {"la_kind": "gla", "decay": DecaySettings(**PALLAS)}),
    "hwh_hgrn_pallas": (
        "tiny",
        "hwh",
        {"la_kind": "hgrn", "hgrn": GatedRecurrenceSettings(**PALLAS)},
    ),
}


def batches(vocab):
    """Two batches equal but in row 0 from position P on (inputs; targets from P - 1), with the
    loss over the targets that are the same in both."""
    rng = np.random.default_rng(0)
    a = rng.integers(0, vocab, (B, T + 1)).astype(np.int32)
    b = a.copy()
    b[0, P:] = rng.integers(0, vocab, T + 1 - P)
    assert (a[0, P:] != b[0, P:]).any()
    mask = np.ones((B, T), np.float32)
    mask[0, P - 1 :] = 0
    out = []
    for x in (a, b):
        out.append(
            {
                "inputs": jnp.asarray(x[:, :-1]),
                "targets": jnp.asarray(x[:, 1:]),
                "segment_ids": jnp.ones((B, T), jnp.int32),
                "positions": jnp.tile(jnp.arange(T), (B, 1)),
                "loss_mask": jnp.asarray(mask),
            }
        )
    return out


def perturbed(params, scale=0.05):
    """Every weight moved by Gaussian noise (zero-initialised ones become non-zero)."""
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(3), len(leaves))
    return jax.tree.unflatten(
        tree, [x + scale * jax.random.normal(k, x.shape, x.dtype) for x, k in zip(leaves, keys)]
    )


def unchanged(x, y):
    """Row 0 before P and all of row 1, at most 1e-6 of the values' scale apart."""
    x, y = np.asarray(x), np.asarray(y)
    tol = 1e-6 * max(1.0, float(np.abs(x).max()))
    return max(np.abs(x[0, :P] - y[0, :P]).max(), np.abs(x[1] - y[1]).max()) <= tol


@pytest.mark.parametrize("name", list(CASES))
def test_changed_future_tokens_move_nothing_before_them(name):
    size, arch, overrides = CASES[name]
    cfg = model_config(arch, size, dtype="float32", window=8, la_chunk_size=CHUNK, **overrides)
    graphdef, params = nnx.split(HybridLM(cfg, rngs=nnx.Rngs(0)), nnx.Param)

    @jax.jit
    def logits_and_grads(params, batch):
        logits = nnx.merge(graphdef, params)(batch["inputs"])
        grads = jax.grad(lambda p: train_loss(graphdef, p, batch)[0])(params)
        return logits, grads

    ba, bb = batches(cfg.vocab_size)
    for stage, p in (("init", params), ("perturbed", perturbed(params))):
        (la, ga), (lb, gb) = logits_and_grads(p, ba), logits_and_grads(p, bb)
        assert unchanged(la, lb), f"{name} ({stage}): a logit before p moved"
        # the change reaches the positions after p (the check can see a change)
        assert float(jnp.abs(la[0, P:] - lb[0, P:]).max()) > 1e-4, f"{name} ({stage})"
        for path, x, y in zip(
            jax.tree_util.tree_leaves_with_path(ga), jax.tree.leaves(ga), jax.tree.leaves(gb)
        ):
            # fp32 rounding: the chunked kernels' backward factors the decay over a whole
            # chunk (the one holding p moves by ~3e-6 of a leaf's scale); a leak moves O(1)
            tol = 1e-4 * max(1e-3, float(jnp.abs(x).max()))
            assert float(jnp.abs(x - y).max()) <= tol, (
                f"{name} ({stage}): the prefix loss's gradient moved at "
                f"{jax.tree_util.keystr(path[0])}"
            )


KERNEL_T, KERNEL_P = 96, 53  # p inside a chunk (32) and a sub-chunk (16), before its middle


def _kernel_inputs(key, decay):
    """bf16 q, k (unit rows), v and fp32 log decay (None, per head or per key) and beta."""
    ks = jax.random.split(key, 5)
    shape = (1, KERNEL_T, 2, 32)
    q = jax.random.normal(ks[0], shape).astype(jnp.bfloat16)
    k = jax.random.normal(ks[1], shape)
    k = (k / jnp.linalg.norm(k, axis=-1, keepdims=True)).astype(jnp.bfloat16)
    v = jax.random.normal(ks[2], shape).astype(jnp.bfloat16)
    g_shape = {"per_head": shape[:3], "per_key": shape}[decay]
    g = jax.nn.log_sigmoid(jax.random.normal(ks[3], g_shape) + 3.0)
    beta = jax.nn.sigmoid(jax.random.normal(ks[4], shape[:3]))
    return q, k, v, g, beta


@pytest.mark.parametrize("op", ["gated_delta_rule", "decay_per_head", "decay_per_key"])
def test_kernels_move_not_even_the_rounding_before_a_change(op):
    """The chunked Pallas kernels (interpreted, bf16 inputs) with the inputs changed from p on:
    the outputs before p and the gradients of a loss over them with respect to every input
    before p are bitwise the same, and the gradients after p exactly 0. A kernel that formed a
    row from a later row's decay (a sub-chunk's middle row as the reference), or a gradient as
    a difference of two sums (GDN's last-row decay gradient), moves them by a rounding step."""
    from kernels_pallas import decay_attention, gated_delta_rule

    if op == "gated_delta_rule":
        s = GDNSettings(chunk_size=32, **PALLAS)
        fn = lambda q, k, v, g, beta: gated_delta_rule(q, k, v, g, beta, settings=s)[0]
    else:
        s = DecaySettings(chunk_size=32, **PALLAS)
        fn = lambda q, k, v, g, beta: decay_attention(q, k, v, g, settings=s)[0]
    decay = "per_key" if op == "decay_per_key" else "per_head"
    a = _kernel_inputs(jax.random.key(0), decay)
    changed = [
        x.at[0, KERNEL_P:].set(y[0, KERNEL_P:])
        for x, y in zip(a, _kernel_inputs(jax.random.key(1), decay))
    ]
    prefix = lambda *xs: (fn(*xs)[0, :KERNEL_P].astype(jnp.float32) ** 2).sum()
    run = jax.jit(lambda *xs: (fn(*xs), jax.grad(prefix, argnums=tuple(range(5)))(*xs)))
    (oa, ga), (ob, gb) = run(*a), run(*changed)
    before = lambda x: np.asarray(x[0, :KERNEL_P].astype(jnp.float32))
    np.testing.assert_array_equal(before(oa), before(ob))
    for name, x, y in zip(("q", "k", "v", "g", "beta"), ga, gb):
        np.testing.assert_array_equal(before(x), before(y), err_msg=f"d{name} before p")
        assert not np.asarray(x[0, KERNEL_P:].astype(jnp.float32)).any(), f"d{name} after p"
