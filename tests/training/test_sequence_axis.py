"""Training with a sequence mesh axis (the time dimension split over devices) equals training
without one: the loss and every gradient of a batch (and the Transformer's losses of two steps:
the step is the same code around the gradients), for the model family's architectures and every
linear-head kind, with and without document masks, on 8 fake CPU devices in fp32. The linear
recurrences pass states between time shards (``kernels_pallas.time_shards``); attention keeps
each device's queries over the gathered keys and values; the short convolutions are left to
GSPMD, which passes their halos; these tests hold all of it to the unsplit run."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hwh_jax.models import model_config
from hwh_jax.profiling import hlo
from hwh_jax.training import sharding as shd
from hwh_jax.training import state as train_state
from hwh_jax.training import steps
from hwh_jax.training.optimizer import OptimizerSpec, make_optimizer

pytestmark = pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (fake) devices")

TOL = 5e-5  # fp32; the split run sums the loss and the states in another order
T = 200  # 100, 50 and 25 tokens a shard at sequence 2, 4 and 8: partial chunks of 64


def _batch(B: int, documents: bool, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, 4096, (B, T + 1)).astype(np.int32)
    seg = np.ones((B, T), np.int32)
    if documents:  # 2-5 documents a row, one boundary at T / 2 (a shard boundary at every size)
        for b in range(B):
            cuts = sorted(set(rng.integers(1, T, rng.integers(1, 4)).tolist()) | {T // 2})
            for c in cuts:
                seg[b, c:] += 1
    starts = np.concatenate([np.ones((B, 1), bool), seg[:, 1:] != seg[:, :-1]], 1)
    pos = np.zeros((B, T), np.int32)
    for b in range(B):
        for t in range(1, T):
            pos[b, t] = 0 if starts[b, t] else pos[b, t - 1] + 1
    return {
        "inputs": tokens[:, :-1],
        "targets": tokens[:, 1:],
        "segment_ids": seg,
        "positions": pos,
        "loss_mask": rng.uniform(0.5, 1.5, (B, T)).astype(np.float32),
    }


_INITIAL = {}


def _initial(cfg, tx):
    """The train state at init on one device, made once per model (both runs start from it)."""
    if cfg not in _INITIAL:
        _INITIAL.clear()
        _INITIAL[cfg] = jax.jit(lambda s: train_state.init_train_state(cfg, tx, s))(jnp.int32(0))
    return _INITIAL[cfg]


def _run(cfg, mesh_dims, batch, document_mask: bool, n_steps: int = 2):
    """(loss, grads) of the batch at init, the losses of ``n_steps`` training steps and the
    compiled gradient program's text."""
    devices = jax.devices()[: int(np.prod(mesh_dims))]
    mesh = shd.make_mesh(mesh_dims, devices)
    tx, schedule = make_optimizer(OptimizerSpec(lr=3e-3, warmup_steps=1, total_steps=10))
    graphdef, abstract, state_sh = train_state.train_state_shardings(cfg, tx, mesh)
    state = jax.device_put(_initial(cfg, tx), state_sh)

    def loss_and_grads(params, b):
        fn = lambda p: steps.train_loss(graphdef, p, b, document_mask=document_mask)
        (_, (loss, _)), g = jax.value_and_grad(fn, has_aux=True)(params)
        return loss, g

    grads_fn = train_state.jit_step(loss_and_grads, mesh, state_sh["params"])
    grads_fn = grads_fn.lower(state["params"], batch).compile()
    loss, grads = grads_fn(state["params"], batch)
    step = train_state.jit_step(
        steps.make_train_step(graphdef, tx, schedule, document_mask=document_mask),
        mesh,
        state_sh,
        out_shardings=(state_sh, None),
    )
    losses = []
    for _ in range(n_steps):  # 0: the gradients only (the step is the same code around them)
        state, metrics = step(state, batch)
        losses.append(float(metrics["loss"]))
    return float(loss), grads, losses, grads_fn.as_text()


def _assert_same(cfg, mesh_dims, document_mask: bool, B: int = 4, n_steps: int = 2):
    batch = _batch(B, documents=document_mask)
    want = _run(cfg, (1, 1, 1, 1), batch, document_mask, n_steps)
    got = _run(cfg, mesh_dims, batch, document_mask, n_steps)
    np.testing.assert_allclose(got[0], want[0], rtol=TOL)
    for (path, w), g in zip(jax.tree_util.tree_leaves_with_path(want[1]), jax.tree.leaves(got[1])):
        scale = float(np.abs(np.asarray(w)).max()) or 1.0
        np.testing.assert_allclose(
            np.asarray(g), np.asarray(w), rtol=TOL, atol=TOL * scale, err_msg=str(path)
        )
    np.testing.assert_allclose(got[2], want[2], rtol=TOL)
    return got[3]


def _passes_states(hlo_text: str, n: int, rank: int = 5) -> bool:
    """The compiled program gathers [n, ...] per-shard states ([n, B, H, K, V]; HGRN's [n, B,
    D]: ``rank`` 3) over the sequence axis."""
    return any(
        c.op == "all-gather" and len(s) == rank and s[0] == n
        for c in hlo.collectives(hlo_text)
        for s in c.shapes
    )


@pytest.mark.parametrize(
    "arch, mesh_dims, document_mask, n_steps",
    [
        ("hwh", (1, 1, 1, 2), True, 0),
        ("hwh", (2, 1, 1, 4), False, 0),  # beside a data axis
        ("layerwise", (1, 2, 1, 4), True, 0),  # beside an fsdp axis
        ("transformer", (1, 1, 1, 8), True, 2),
    ],
)
def test_architectures_train_the_same_with_a_sequence_axis(arch, mesh_dims, document_mask, n_steps):
    cfg = model_config(arch, "tiny", dtype="float32")
    hlo_text = _assert_same(cfg, mesh_dims, document_mask, n_steps=n_steps)
    if arch != "transformer":
        assert _passes_states(hlo_text, mesh_dims[-1])


@pytest.mark.parametrize(
    "kind", ["deltanet", "lightning", "retnet", "mamba2", "gla", "hgrn", "hgrn2"]
)
def test_every_linear_kind_trains_the_same_with_a_sequence_axis(kind):
    cfg = model_config("hwh", "tiny", dtype="float32", la_kind=kind)
    hlo_text = _assert_same(cfg, (1, 1, 1, 8), document_mask=True, B=2, n_steps=0)
    assert _passes_states(hlo_text, 8, rank=3 if kind == "hgrn" else 5)


def test_a_sequence_axis_splits_the_activations():
    """The compiled step's memory per device falls with the sequence axis (the activations'
    time dimension is split), the hwh_tiny model at T = 200, batch 4."""
    cfg = model_config("hwh", "tiny", dtype="float32")
    tx, schedule = make_optimizer(OptimizerSpec(lr=1e-3, warmup_steps=1, total_steps=10))
    batch = jax.eval_shape(lambda: {k: jnp.asarray(v) for k, v in _batch(4, False).items()})
    temp = {}
    for n in (1, 4):
        mesh = shd.make_mesh((1, 1, 1, n), jax.devices()[:n])
        graphdef, abstract, state_sh = train_state.train_state_shardings(cfg, tx, mesh)
        step = train_state.jit_step(
            steps.make_train_step(graphdef, tx, schedule),
            mesh,
            state_sh,
            out_shardings=(state_sh, None),
        )
        temp[n] = step.lower(abstract, batch).compile().memory_analysis().temp_size_in_bytes
    assert temp[4] < 0.5 * temp[1], temp


def test_the_last_shards_causal_load_against_a_count():
    """``flops.sequence_load``: the last shard's causal attention over the mean, against a count
    of the (query, key) pairs each shard's queries see; the attention share against the FLOPs
    formula (its only term that grows with the context)."""
    from hwh_jax.training.flops import flops_per_token, sequence_load
    from kernels_pallas.attention import zigzag

    balanced = model_config("hwh", "small")
    cfg = model_config("hwh", "small", attention={"balance": False})
    for T, n in [(4096, 4), (8192, 16)]:
        L = T // n
        pairs = [sum(q + 1 for q in range(i * L, (i + 1) * L)) for i in range(n)]
        r = sequence_load(cfg, T, n)
        assert r["last_shard_attention"] == pytest.approx(pairs[-1] / np.mean(pairs), rel=2 / L)
        swapped = zigzag.positions(T, n).reshape(n, L) + 1  # each device's rows' key counts
        b = sequence_load(balanced, T, n)
        assert b["balanced"] and not r["balanced"]
        assert b["last_shard_attention"] == swapped.sum(1).max() / swapped.sum(1).mean() == 1.0
        assert b["last_shard_compute"] == 1.0
        share = 1 - flops_per_token(cfg, 0) / flops_per_token(cfg, T)
        assert r["attention_share"] == pytest.approx(share, rel=1e-9)
        assert r["last_shard_compute"] == pytest.approx(
            1 + r["attention_share"] * (r["last_shard_attention"] - 1)
        )
    assert sequence_load(cfg, 4096, 1)["last_shard_compute"] == 1.0
    with pytest.raises(ValueError, match="shards must be >= 1, got 0"):
        sequence_load(cfg, 4096, 0)
