"""The time dimension split over a mesh axis: each op's outputs, final state and gradients equal
the unsplit op's (8 fake CPU devices, fp32)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh

import kernels_pallas
from hwh_jax.layers.heads.parts import RESET_LOG_DECAY
from kernels_pallas.gdn import GDNSettings

TOL = 2e-5  # fp32: the split run folds the shards' states in another order of additions


def _mesh(batch: int, seq: int) -> Mesh:
    devices = np.asarray(jax.devices()[: batch * seq]).reshape(batch, 1, 1, seq)
    return Mesh(devices, ("data", "fsdp", "tensor", "sequence"))


def _inputs(B, T, H, K, V, seed=0, documents=False, decay=True):
    ks = jax.random.split(jax.random.key(seed), 6)
    q = jax.random.normal(ks[0], (B, T, H, K))
    k = jax.random.normal(ks[1], (B, T, H, K))
    k = k / jnp.linalg.norm(k, axis=-1, keepdims=True)
    v = jax.random.normal(ks[2], (B, T, H, V))
    beta = jax.nn.sigmoid(jax.random.normal(ks[3], (B, T, H)))
    g = -jax.nn.softplus(jax.random.normal(ks[4], (B, T, H))) * 0.3 if decay else None
    if documents:  # document starts at random tokens, some inside shards, one on a boundary
        starts = jax.random.bernoulli(ks[5], 0.05, (B, T)).at[:, T // 2].set(True)
        g = jnp.where(starts[..., None], RESET_LOG_DECAY, jnp.zeros((B, T, H)) if g is None else g)
    h0 = jax.random.normal(ks[5], (B, H, K, V)) * 0.1
    return q, k, v, g, beta, h0


def _run(mesh, impl, args, final: bool):
    q, k, v, g, beta, h0 = args
    settings = GDNSettings(impl=impl, chunk_size=16)

    def loss(q, k, v, g, beta, h0):
        o, s = kernels_pallas.gated_delta_rule(
            q, k, v, g, beta, initial_state=h0, output_final_state=final, settings=settings
        )
        w = jnp.cos(jnp.arange(o.size, dtype=jnp.float32)).reshape(o.shape)  # every output
        return (o * w).sum() + (jnp.sum(s * s) if final else 0.0), (o, s)

    argnums = tuple(i for i, x in enumerate(args) if x is not None)
    fn = jax.value_and_grad(loss, argnums=argnums, has_aux=True)
    with kernels_pallas.kernel_mesh(mesh):
        (value, (o, s)), grads = jax.jit(fn)(*args)
    return value, o, s, grads


@pytest.mark.parametrize(
    "seq, batch, T, documents, decay",
    [
        (2, 2, 96, False, True),  # with data parallelism; 48 tokens a shard: a partial chunk
        (4, 2, 72, True, True),  # 18 a shard, documents starting inside shards and on a boundary
        (8, 1, 40, True, False),  # DeltaNet (no decay), 5 tokens a shard: every chunk partial
    ],
)
def test_gated_delta_rule_over_a_sequence_axis_equals_the_unsplit_run(
    seq, batch, T, documents, decay
):
    args = _inputs(batch, T, 2, 16, 8, documents=documents, decay=decay)
    for impl in ("chunk_reference", "recurrent"):
        want = _run(None, impl, args, final=True)
        got = _run(_mesh(batch, seq), impl, args, final=True)
        for w, g in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
            np.testing.assert_allclose(g, w, rtol=TOL, atol=TOL, err_msg=impl)
    # without the final state, and with no initial state: the first shard starts from zero
    q, k, v, g, beta, _ = args
    want = _run(None, "chunk_reference", (q, k, v, g, beta, None), final=False)
    got = _run(_mesh(batch, seq), "chunk_reference", (q, k, v, g, beta, None), final=False)
    for w, g in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
        np.testing.assert_allclose(g, w, rtol=TOL, atol=TOL)


def test_a_planted_error_in_the_passed_state_is_caught():
    """The test above can fail: shards that ignore the state they receive (each from zero)
    differ from the unsplit run."""
    args = _inputs(1, 32, 2, 16, 8)
    q, k, v, g, beta, _ = args
    want = _run(None, "chunk_reference", (q, k, v, g, beta, None), final=False)[1]
    halves = [
        kernels_pallas.gated_delta_rule(
            *(x[:, i : i + 16] for x in (q, k, v, g, beta)),
            settings=GDNSettings(impl="chunk_reference", chunk_size=16),
        )[0]
        for i in (0, 16)
    ]
    np.testing.assert_allclose(halves[0], want[:, :16], rtol=TOL, atol=TOL)
    assert np.abs(np.asarray(halves[1] - want[:, 16:])).max() > 1e-2


def _value_and_grads(fn, mesh, args):
    """(value, outputs, gradients) of ``fn(*args) -> (out, final state)`` weighted over every
    output and the final state, under ``mesh`` (None: unsplit)."""

    def loss(*xs):
        o, s = fn(*xs)
        w = jnp.cos(jnp.arange(o.size, dtype=jnp.float32)).reshape(o.shape)
        return (o * w).sum() + jnp.sum(s * s), (o, s)

    argnums = tuple(i for i, x in enumerate(args) if x is not None)
    with kernels_pallas.kernel_mesh(mesh):
        return jax.jit(jax.value_and_grad(loss, argnums=argnums, has_aux=True))(*args)


def _assert_split_equals_unsplit(fn, args, batch, seq):
    want = _value_and_grads(fn, None, args)
    got = _value_and_grads(fn, _mesh(batch, seq), args)
    for w, g in zip(jax.tree.leaves(want), jax.tree.leaves(got)):  # atol: of the leaf's scale
        scale = max(float(np.abs(np.asarray(w)).max()), 1.0)
        np.testing.assert_allclose(g, w, rtol=TOL, atol=TOL * scale)


@pytest.mark.parametrize(
    "seq, batch, T, per_key, documents",
    [
        (2, 2, 96, False, False),  # Lightning / RetNet / Mamba-2's scalar decay, a partial chunk
        (4, 2, 72, True, True),  # GLA / HGRN-2's decay per key, documents inside shards
        (8, 1, 40, False, True),  # 5 tokens a shard
    ],
)
def test_decay_attention_over_a_sequence_axis_equals_the_unsplit_run(
    seq, batch, T, per_key, documents
):
    q, k, v, g, _, h0 = _inputs(batch, T, 2, 16, 8, documents=documents)
    if per_key:  # a different decay in every key dimension
        spread = jnp.linspace(0.2, 2.0, 16)
        g = jnp.maximum(g[..., None] * spread, RESET_LOG_DECAY)
    for impl in ("chunk_reference",) + (("recurrent",) if seq == 8 else ()):
        settings = kernels_pallas.DecaySettings(impl=impl, chunk_size=16)

        def fn(q, k, v, g, h0, settings=settings):
            return kernels_pallas.decay_attention(
                q, k, v, g, initial_state=h0, output_final_state=True, settings=settings
            )

        _assert_split_equals_unsplit(fn, (q, k, v, g, h0), batch, seq)
        _assert_split_equals_unsplit(fn, (q, k, v, g, None), batch, seq)


@pytest.mark.parametrize("seq, batch, T", [(2, 2, 96), (8, 1, 40)])
def test_gated_recurrence_over_a_sequence_axis_equals_the_unsplit_run(seq, batch, T):
    ks = jax.random.split(jax.random.key(1), 3)
    a = jax.nn.sigmoid(jax.random.normal(ks[0], (batch, T, 24)) + 2.0)
    a = a.at[:, T // 3].set(0.0)  # a document start inside a shard: the gate closes
    b = jax.random.normal(ks[1], (batch, T, 24))
    h0 = jax.random.normal(ks[2], (batch, 24))
    for impl in ("scan", "recurrent"):
        settings = kernels_pallas.GatedRecurrenceSettings(impl=impl)

        def fn(a, b, h0, settings=settings):
            return kernels_pallas.gated_recurrence(
                a, b, initial_state=h0, output_final_state=True, settings=settings
            )

        _assert_split_equals_unsplit(fn, (a, b, h0), batch, seq)


@pytest.mark.parametrize(
    "seq, batch, window, documents",
    [(2, 2, None, True), (4, 1, 24, True), (8, 1, None, False)],
)
def test_attention_over_a_sequence_axis_equals_the_unsplit_run(seq, batch, window, documents):
    """Each time shard's queries over the gathered keys and values, masked by global position
    (causal, a window reaching back across shards, documents across shard boundaries), GQA;
    causal without a window with the devices' query halves swapped (``zigzag``) and without;
    the reference and the reference by query blocks (``blocked``, blocks of 8)."""
    T = 96
    ks = jax.random.split(jax.random.key(2), 3)
    q = jax.random.normal(ks[0], (batch, T, 4, 8))
    k, v = (jax.random.normal(x, (batch, T, 2, 8)) for x in ks[1:])
    seg = jnp.asarray(np.repeat([[0, 1, 2]], batch, 0).repeat([30, 41, 25], axis=1))
    seg = seg if documents else None
    for impl in ("reference", "blocked"):
        settings = kernels_pallas.AttentionSettings(impl=impl, block_q=8)

        def fn(q, k, v, settings=settings):
            o = kernels_pallas.attention(q, k, v, window=window, segment_ids=seg, settings=settings)
            return o, jnp.zeros(())

        with kernels_pallas.kernel_mesh(_mesh(batch, seq)):
            assert ("ppermute" in str(jax.make_jaxpr(fn)(q, k, v))) == (window is None)
        _assert_split_equals_unsplit(fn, (q, k, v), batch, seq)
        if window is None:  # each device its own queries
            unbalanced = kernels_pallas.AttentionSettings(impl=impl, block_q=8, balance=False)
            _assert_split_equals_unsplit(
                functools.partial(fn, settings=unbalanced), (q, k, v), batch, seq
            )


@pytest.mark.parametrize("window, documents, T", [(None, True, 512), (150, False, 256)])
def test_splash_over_a_sequence_axis_equals_the_unsplit_run(window, documents, T):
    """Splash (the Pallas interpreter) with its queries split over a sequence axis of 2: each
    device runs its rows of the whole sequence's mask tables over the gathered keys; values and
    gradients equal the unsplit reference's (causal, a window reaching into the other shard,
    documents across the shard boundary), two batch rows over the data axis, GQA. Causal
    without a window, the devices first swap half their queries (``zigzag``: tables in the
    swapped order, the outputs swapped back)."""
    batch = 2
    ks = jax.random.split(jax.random.key(3), 3)
    q = jax.random.normal(ks[0], (batch, T, 4, 64))
    k, v = (jax.random.normal(x, (batch, T, 2, 64)) for x in ks[1:])
    cuts = [70, 100, 86] if T == 256 else [70, 250, 192]
    seg = jnp.asarray(np.repeat([[0, 1, 2]], batch, 0).repeat(cuts, axis=1))
    seg = seg if documents else None

    def fn(settings):
        return lambda q, k, v: (
            kernels_pallas.attention(q, k, v, window=window, segment_ids=seg, settings=settings),
            jnp.zeros(()),
        )

    reference = kernels_pallas.AttentionSettings(impl="reference")
    splash = kernels_pallas.AttentionSettings(impl="splash", interpret=True)
    want = _value_and_grads(fn(reference), None, (q, k, v))
    mesh = _mesh(batch, 2)
    with kernels_pallas.kernel_mesh(mesh):
        jaxpr = str(jax.make_jaxpr(fn(splash))(q, k, v))
    assert "all_gather" in jaxpr and f"f32[1,{T // 2},4,64]" in jaxpr  # a row's queries a device
    assert ("ppermute" in jaxpr) == (window is None)  # the swap: causal, no window
    got = _value_and_grads(fn(splash), mesh, (q, k, v))
    for w, g in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
        np.testing.assert_allclose(g, w, rtol=TOL, atol=TOL * max(float(np.abs(w).max()), 1.0))
