"""The attention dispatcher against its reference, and the reference against jax.nn."""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels_pallas import AttentionSettings, attention, attention_reference, dispatch

SPLASH = AttentionSettings(impl="splash", interpret=True)

# (B, T, H, G, D, window)
SHAPES = [
    (2, 37, 4, 2, 16, None),
    (1, 64, 4, 1, 32, 9),
    (2, 50, 3, 3, 8, 1),
    (1, 40, 8, 2, 16, 100),
]
IDS = [f"B{b}-T{t}-H{h}-G{g}-D{d}-W{w}" for b, t, h, g, d, w in SHAPES]


def qkv(B, T, H, G, D, seed=0, dtype=jnp.float32):
    rng = np.random.default_rng(seed)
    n = lambda *s: jnp.asarray(rng.standard_normal(s, dtype=np.float32), dtype)
    return n(B, T, H, D), n(B, T, G, D), n(B, T, G, D)


@pytest.mark.parametrize("shape", SHAPES, ids=IDS)
def test_reference_matches_jax_nn(shape):
    B, T, H, G, D, w = shape
    q, k, v = qkv(B, T, H, G, D)
    ref = attention_reference(q, k, v, causal=True, window=w)
    other = jax.nn.dot_product_attention(
        q,
        k,
        v,
        is_causal=True,
        implementation="xla",
        local_window_size=None if w is None else (w - 1, 0),
    )
    np.testing.assert_allclose(ref, other, atol=2e-6, rtol=2e-6)


def test_reference_against_loop():
    """Brute force per (b, h, t) in float64 NumPy, window and GQA included."""
    B, T, H, G, D, w = 1, 12, 4, 2, 8, 5
    q, k, v = qkv(B, T, H, G, D, seed=1)
    out = np.asarray(attention_reference(q, k, v, window=w, scale=0.3))
    qn, kn, vn = (np.asarray(x, np.float64) for x in (q, k, v))
    for h in range(H):
        g = h // (H // G)
        for t in range(T):
            keys = [s for s in range(T) if s <= t and s > t - w]
            z = np.array([0.3 * qn[0, t, h] @ kn[0, s, g] for s in keys])
            p = np.exp(z - z.max())
            p /= p.sum()
            np.testing.assert_allclose(out[0, t, h], p @ vn[0, keys, g], atol=1e-5)


def test_segment_ids_isolate_documents():
    B, T, H, G, D = 1, 20, 2, 2, 8
    q, k, v = qkv(B, T, H, G, D, seed=2)
    seg = jnp.array([[0] * 7 + [1] * 13])
    out = attention_reference(q, k, v, segment_ids=seg)
    second = attention_reference(q[:, 7:], k[:, 7:], v[:, 7:])
    np.testing.assert_allclose(out[:, 7:], second, atol=1e-6)


@pytest.mark.parametrize("window, documents", [(None, False), (7, False), (None, True)])
def test_blocked_equals_the_reference_with_its_gradients(window, documents):
    """impl="blocked" (query blocks one at a time, each recomputed in the backward): the
    reference's outputs and q, k, v gradients, GQA, a window and documents included; a length
    that is not a multiple of the block falls back to the reference."""
    B, T, H, G, D = 2, 48, 4, 2, 8
    q, k, v = qkv(B, T, H, G, D, seed=5)
    seg = jnp.array([[0] * 20 + [1] * 28, [0] * 48]) if documents else None
    blocked = AttentionSettings(impl="blocked", block_q=16)
    cot = jnp.asarray(np.random.default_rng(6).standard_normal((B, T, H, D), np.float32))

    def loss(f):
        return lambda q, k, v: jnp.sum(f(q, k, v, window=window, segment_ids=seg) * cot)

    ours = functools.partial(attention, settings=blocked)
    np.testing.assert_allclose(
        ours(q, k, v, window=window, segment_ids=seg),
        attention_reference(q, k, v, window=window, segment_ids=seg),
        atol=1e-6,
    )
    g_ours = jax.grad(loss(ours), argnums=(0, 1, 2))(q, k, v)
    g_ref = jax.grad(loss(attention_reference), argnums=(0, 1, 2))(q, k, v)
    for a, b in zip(g_ours, g_ref):
        np.testing.assert_allclose(a, b, atol=1e-5)
    assert dispatch.chosen()["attention@cpu"] == "blocked"
    assert "scan" in str(jax.make_jaxpr(ours)(q, k, v))  # the blocks as a loop
    odd = qkv(1, 40, 2, 1, 8, seed=7)  # 40 queries: not a multiple of 16
    np.testing.assert_array_equal(ours(*odd), attention_reference(*odd))
    with pytest.raises(ValueError, match="block_q"):
        AttentionSettings(impl="blocked", block_q=0)


def test_auto_on_cpu_is_reference_and_recorded():
    q, k, v = qkv(1, 8, 2, 1, 8)
    np.testing.assert_array_equal(attention(q, k, v), attention_reference(q, k, v))
    assert dispatch.chosen()["attention@cpu"] == "reference"


@pytest.mark.parametrize("window", [None, 100], ids=["causal", "W100"])
def test_splash_interpret_matches_reference(window):
    """The TPU path (splash attention) run by the Pallas interpreter on the CPU."""
    q, k, v = qkv(1, 256, 4, 2, 64, seed=3)
    ref = attention_reference(q, k, v, window=window)
    out = attention(q, k, v, window=window, settings=SPLASH)
    np.testing.assert_allclose(out, ref, atol=2e-5, rtol=2e-5)


def test_bad_inputs_raise():
    q, k, v = qkv(1, 8, 3, 2, 8)
    with pytest.raises(ValueError, match="divisible"):
        attention(q, k, v)
    q, k, v = qkv(1, 8, 2, 1, 8)
    with pytest.raises(ValueError, match="window"):
        attention(q, k, v, window=0)
    with pytest.raises(ValueError, match="impl='flash'"):
        AttentionSettings(impl="flash")


def test_auto_takes_cudnn_for_documents_only_at_even_lengths():
    """On a GPU, "auto" gives documents to cuDNN as a bias where its backward takes one (an
    even length), else to the reference; without documents any length goes to cuDNN."""
    from kernels_pallas.attention.op import choose

    gpu = AttentionSettings(platform="gpu")
    seg = jnp.zeros((1, 8), jnp.int32)
    q = lambda T: jnp.zeros((1, T, 2, 64), jnp.bfloat16)
    assert choose(gpu, q(8), segment_ids=seg) == "cudnn"
    assert choose(gpu, q(7), segment_ids=seg[:, :7]) == "reference"
    assert choose(gpu, q(7)) == "cudnn"


@pytest.mark.parametrize("window", [None, (255, 0), (700, 0), (0, 0), (100, None)])
def test_splash_block_tables_equal_splashs_own_masks(window):
    """The causal and local masks that answer whole blocks without evaluating them say what
    splash's own masks say of any slice (any, all), and give splash's block tables (forward
    and backward, three block sizes) equal to those of splash's own masks."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask_info as mi

    from kernels_pallas.attention import tpu

    T = 2048
    if window is None:
        fast, theirs = tpu._CausalBand((T, T)), sm.CausalMask((T, T))
    else:
        fast = tpu._LocalBand((T, T), window_size=window, offset=0)
        theirs = sm.LocalMask((T, T), window_size=window, offset=0)
    n = 20  # every slice of a small mask of the same band: what any() and all() answer
    w = None if window is None else tuple(None if x is None else min(x, 5) for x in window)
    small = tpu._CausalBand((n, n)) if w is None else tpu._LocalBand((n, n), w, offset=0)
    exact = sm.CausalMask((n, n)) if w is None else sm.LocalMask((n, n), w, offset=0)
    for q0, q1, k0, k1 in itertools.product(range(n), range(1, n + 1), range(n), range(1, n + 1)):
        if q0 < q1 and k0 < k1:
            idx = (slice(q0, q1), slice(k0, k1))
            assert small[idx].any() == exact[idx].any(), idx
            assert small[idx].all() == exact[idx].all(), idx
    for block in (128, 256, 512):
        for dkv in (False, True):
            ours, _ = mi._process_mask(sm.MultiHeadMask([fast] * 2), (block, block), is_dkv=dkv)
            ref, _ = mi._process_mask(sm.MultiHeadMask([theirs] * 2), (block, block), is_dkv=dkv)
            for field in ref._fields:
                a, b = getattr(ours, field), getattr(ref, field)
                assert (a is None) == (b is None), field
                if b is not None:
                    np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=field)


def test_splash_interpret_keeps_documents_apart():
    """Splash with segment ids (the TPU path of a packed batch) equals the reference's masks:
    values and gradients, a causal and a windowed case, documents of two rows cut apart."""
    q, k, v = qkv(2, 256, 4, 2, 64, seed=6)
    seg = jnp.asarray(np.repeat([[0, 1, 2, 3], [0, 0, 1, 1]], [40, 90, 100, 26], axis=1))
    dy = qkv(2, 256, 4, 2, 64, seed=7)[0]
    for window in (None, 100):

        def grads(settings, window=window):
            f = lambda q, k, v: jnp.sum(
                attention(q, k, v, window=window, segment_ids=seg, settings=settings) * dy
            )
            return jax.value_and_grad(f, argnums=(0, 1, 2))(q, k, v)

        want = grads(AttentionSettings(impl="reference"))
        got = grads(SPLASH)
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
            np.testing.assert_allclose(a, b, atol=2e-5, rtol=2e-5)


@pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 devices (XLA_FLAGS fakes them on CPU)")
def test_kernel_per_shard_under_a_mesh():
    """Under ``kernel_mesh`` a kernel impl runs in a shard_map over batch rows and heads (q and
    kv heads alike): same values and gradients as on one device. Splash in interpret mode
    stands in for cuDNN, whose own partitioner rejected an FSDP mesh's q/k/v shardings."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from hwh_jax.training.sharding import make_mesh
    from kernels_pallas import kernel_mesh

    mesh = make_mesh((2, 2, 2))
    q, k, v = qkv(4, 256, 4, 2, 64, seed=4)
    dy = qkv(4, 256, 4, 2, 64, seed=5)[0]

    def f(q, k, v):
        def loss(q, k, v):
            return jnp.sum(attention(q, k, v, settings=SPLASH) * dy)

        return jax.value_and_grad(loss, argnums=(0, 1, 2))(q, k, v)

    ref = jax.jit(f)(q, k, v)
    rows = NamedSharding(mesh, P(("data", "fsdp")))
    args = [jax.device_put(a, rows) for a in (q, k, v)]
    with kernel_mesh(mesh):
        jaxpr = str(jax.make_jaxpr(f)(*args))
        out = jax.jit(f)(*args)
    assert "shard_map" in jaxpr and "f32[1,256,2,64]" in jaxpr  # 1 row, 2 of 4 q heads
    for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(ref)):
        np.testing.assert_allclose(a, b, atol=2e-5, rtol=2e-5)


def _cache_case(B, T, S, H, G, D, seed, ring):
    """T new queries over S cache slots: times 0..S-1 with the tail empty (-1), or shuffled
    times of a ring with empty slots; rows starting at different times (left padding)."""
    rng = np.random.default_rng(seed)
    q, _, _ = qkv(B, T, H, G, D, seed=seed)
    _, k, v = qkv(B, S, H, G, D, seed=seed + 1)
    q_time = jnp.arange(T, dtype=jnp.int32) + (S - T if not ring else S // 2)
    if ring:
        k_time = rng.permutation(S).astype(np.int32)
        k_time[rng.random(S) < 0.2] = -1
    else:
        k_time = np.where(np.arange(S) < S - 3, np.arange(S), -1).astype(np.int32)
    k_start = jnp.asarray(rng.integers(0, 4, B), jnp.int32)
    return q, k, v, q_time, jnp.asarray(k_time), k_start


@pytest.mark.parametrize(
    "ring,window,block",
    [(False, None, 16), (False, None, 7), (True, 9, 16), (True, None, 64), (False, 5, 5)],
)
def test_blockwise_cached_attention_matches_reference(ring, window, block):
    """The prefill path (online softmax over cache blocks) against the reference that forms
    all logits: blocks dividing the cache and not, ring caches with empty slots, windows,
    left-padded rows, GQA; a query seeing no key (window past every written slot) gives 0."""
    from kernels_pallas import cached_attention, cached_attention_blockwise

    q, k, v, q_time, k_time, k_start = _cache_case(2, 12, 40, 4, 2, 16, seed=block, ring=ring)
    kw = dict(q_time=q_time, k_time=k_time, k_start=k_start, window=window)
    ref = cached_attention(q, k, v, **kw)
    out = cached_attention_blockwise(q, k, v, block=block, **kw)
    np.testing.assert_allclose(out, ref, atol=2e-6, rtol=2e-5)
    if window is not None:  # queries far past the cache: nothing visible -> zeros
        far = cached_attention_blockwise(q, k, v, block=block, **{**kw, "q_time": q_time + 1000})
        np.testing.assert_array_equal(far, 0.0)


def test_blockwise_cached_attention_visits_only_blocks_a_query_may_see():
    """A prompt's chunk over a cache allocated for the whole context: blocks past the chunk
    (empty) and, with a window, blocks wholly before it are skipped; the output still equals
    the reference's."""
    from kernels_pallas import cached_attention, cached_attention_blockwise
    from kernels_pallas.attention.cached import visible_blocks

    q, k, v, _, _, k_start = _cache_case(2, 12, 64, 4, 2, 16, seed=5, ring=False)
    q_time = jnp.arange(12, dtype=jnp.int32) + 20  # times 20..31
    k_time = jnp.asarray(np.where(np.arange(64) < 32, np.arange(64), -1), jnp.int32)
    for window, want in ((None, [0, 1, 2, 3]), (6, [1, 2, 3])):  # blocks of 8 slots
        order, count = visible_blocks(k_time, q_time, window, 8)
        assert int(count) == len(want) and order[: len(want)].tolist() == want
        kw = dict(q_time=q_time, k_time=k_time, k_start=k_start, window=window)
        np.testing.assert_allclose(
            cached_attention_blockwise(q, k, v, block=8, **kw),
            cached_attention(q, k, v, **kw),
            atol=2e-6,
            rtol=2e-5,
        )
    _, count = visible_blocks(jnp.full((64,), -1, jnp.int32), q_time, None, 8)
    assert int(count) == 0  # an empty cache: nothing visited, every query returns zeros
    empty = dict(q_time=q_time, k_time=jnp.full((64,), -1, jnp.int32), k_start=k_start)
    np.testing.assert_array_equal(cached_attention_blockwise(q, k, v, block=8, **empty), 0.0)


def test_blockwise_cached_attention_bf16_within_bf16_noise():
    from kernels_pallas import cached_attention, cached_attention_blockwise

    q, k, v, q_time, k_time, k_start = _cache_case(1, 32, 96, 4, 4, 32, seed=3, ring=False)
    kw = dict(q_time=q_time, k_time=k_time, k_start=k_start)
    exact = cached_attention(q, k, v, **kw)
    bf = lambda x: x.astype(jnp.bfloat16)
    out = cached_attention_blockwise(bf(q), bf(k), bf(v), block=32, **kw)
    assert out.dtype == jnp.bfloat16
    err = float(jnp.linalg.norm(out.astype(jnp.float32) - exact) / jnp.linalg.norm(exact))
    assert err < 1e-2, err
    with pytest.raises(ValueError, match="block must be >= 1, got 0"):
        cached_attention_blockwise(q, k, v, block=0, **kw)


DECODE = dict(impl="pallas", interpret=True, block=16, min_programs=8, min_heads=1)


@pytest.mark.parametrize(
    "ring,window,G", [(False, None, 2), (True, 9, 2), (False, 5, 4), (True, None, 1)]
)
def test_decode_attention_kernel_matches_reference(ring, window, G):
    """The decode kernel (interpreted) against the reference that forms all logits: several
    splits of several blocks, ring caches with empty slots, windows, left-padded rows, GQA and
    MHA; a query that sees no key (window past every slot) returns zeros."""
    from kernels_pallas import DecodeAttentionSettings, cached_attention, decode_attention
    from kernels_pallas.attention.decode import plan

    q, k, v, q_time, k_time, k_start = _cache_case(3, 1, 128, 4, G, 16, seed=G, ring=ring)
    settings = DecodeAttentionSettings(**{**DECODE, "min_programs": 3 * G * 4})
    p = plan(3, G, 128, settings)
    assert (p.block, p.steps, p.splits(128)) == (16, 2, 4)  # the loop and the merge
    kw = dict(q_time=q_time, k_time=k_time, k_start=k_start, window=window)
    np.testing.assert_allclose(
        decode_attention(q, k, v, settings=settings, **kw),
        cached_attention(q, k, v, **kw),
        atol=2e-6,
        rtol=2e-5,
    )
    if window is not None:
        far = decode_attention(q, k, v, settings=settings, **{**kw, "q_time": q_time + 1000})
        np.testing.assert_array_equal(far, 0.0)


def test_decode_attention_bf16_within_bf16_noise_and_its_fallbacks():
    """bf16 caches (the products on tensor cores, probabilities rounded to bf16) within 1% of
    the fp32 reference; a cache of slots not a multiple of 16 runs the reference, recorded;
    more than one query token, or more than 16 query heads a kv head, is refused."""
    import kernels_pallas
    from kernels_pallas import DecodeAttentionSettings, cached_attention, decode_attention

    settings = DecodeAttentionSettings(**DECODE)
    q, k, v, q_time, k_time, k_start = _cache_case(2, 1, 96, 4, 2, 32, seed=7, ring=False)
    kw = dict(q_time=q_time, k_time=k_time, k_start=k_start)
    exact = cached_attention(q, k, v, **kw)
    bf = lambda x: x.astype(jnp.bfloat16)
    out = decode_attention(bf(q), bf(k), bf(v), settings=settings, **kw)
    assert out.dtype == jnp.bfloat16 and kernels_pallas.chosen()["decode_attention@cpu"] == "pallas"
    err = float(jnp.linalg.norm(out.astype(jnp.float32) - exact) / jnp.linalg.norm(exact))
    assert err < 1e-2, err
    q, k, v, q_time, k_time, k_start = _cache_case(2, 1, 40, 4, 2, 16, seed=8, ring=False)
    kw = dict(q_time=q_time, k_time=k_time, k_start=k_start)
    np.testing.assert_array_equal(
        decode_attention(q, k, v, settings=settings, **kw), cached_attention(q, k, v, **kw)
    )
    assert kernels_pallas.chosen()["decode_attention@cpu"] == "reference"
    with pytest.raises(ValueError, match="one query token a row"):
        decode_attention(jnp.concatenate([q, q], 1), k, v, settings=settings, **kw)
    with pytest.raises(ValueError, match="at most 16 query heads a kv head"):
        decode_attention(jnp.zeros((2, 1, 34, 16)), k, v, settings=settings, **kw)
    with pytest.raises(ValueError, match="min_programs must be >= 1, got 0"):
        DecodeAttentionSettings(min_programs=0)


def test_decode_attention_plan_fills_the_device_and_caps_the_splits():
    """Splits: the fewest keeping >= min_programs programs, at most max_splits; blocks: the
    largest power of two <= block dividing the slots; no plan (the reference) off multiples of
    16 or below min_heads rows x kv heads."""
    from kernels_pallas import DecodeAttentionSettings
    from kernels_pallas.attention.decode import plan

    default = DecodeAttentionSettings()
    p = plan(32, 5, 32768, default)  # 32 x 5 x 8 = 1280 programs >= 1024
    assert (p.block, p.splits(32768)) == (128, 8)
    one = default.replace(min_heads=1)
    assert plan(1, 1, 32768, one).splits(32768) == 32  # capped: 256 would fill
    assert plan(1, 1, 32768, one.replace(max_splits=256)).splits(32768) == 256
    assert plan(4, 2, 96, default).block == 32 and plan(4, 2, 40, default) is None
    assert plan(1, 5, 32768, default) is None and plan(1, 8, 32768, default) is not None


def _documents(B, T, seed):
    """[B, T] segment ids: 2-4 documents a row, cut anywhere (inside shards and on their edges)."""
    rng = np.random.default_rng(seed)
    seg = np.ones((B, T), np.int32)
    for b in range(B):
        for c in rng.integers(1, T, rng.integers(1, 4)):
            seg[b, c:] += 1
    return jnp.asarray(seg)


@pytest.mark.parametrize(
    "shards,documents,causal,window,L",
    [
        (3, True, True, None, 12),
        (2, True, False, None, 12),
        (4, False, True, 5, 12),  # within a block: the block before is a band
        (4, True, True, 30, 12),  # reaching three blocks back: whole blocks and bands
        (2, True, True, 20, 128),  # 64 of 128 queries see the 64 keys before the shard
    ],
)
def test_shard_rows_merge_equals_the_whole_sequences_rows(shards, documents, causal, window, L):
    """``shard_rows`` (a shard's diagonal block and the blocks before it, merged by
    log-sum-exp, the backward run per block with the merged output and lse, the blocks before
    the sequence dropped) on XLA blocks: for every shard, the values and the gradients of q, k
    and v equal those of ``attention_reference`` over the whole sequence, with the shard's
    index traced, GQA, documents and sliding windows."""
    from kernels_pallas.attention import shard_rows

    B, H, G, D = 2, 4, 2, 16
    T = shards * L
    q, k, v = qkv(B, T, H, G, D, seed=7)
    dy = qkv(B, T, H, G, D, seed=8)[0]
    seg = _documents(B, T, seed=9) if documents else None

    def whole(q, k, v):
        o = attention_reference(q, k, v, causal=causal, window=window, segment_ids=seg)
        return jnp.sum(o * dy), o

    want, ref = jax.grad(whole, argnums=(0, 1, 2), has_aux=True)(q, k, v)

    @jax.jit
    def shard(i, q_rows, k, v):
        rows = lambda x: jax.lax.dynamic_slice_in_dim(x, i * L, L, axis=1)
        q_seg = None if seg is None else rows(seg)

        def loss(q_rows, k, v):
            o = shard_rows.shard_rows(q_rows, k, v, i, shards=shards, causal=causal,
                                      window=window, segment_ids=q_seg, kv_segment_ids=seg,
                                      blocks=shard_rows.REFERENCE)  # fmt: skip
            return jnp.sum(o * rows(dy)), o

        return jax.grad(loss, argnums=(0, 1, 2), has_aux=True)(q_rows, k, v)

    out, dq, dk, dv = [], [], jnp.zeros_like(k), jnp.zeros_like(v)
    for i in range(shards):
        (dq_i, dk_i, dv_i), o_i = shard(jnp.int32(i), q[:, i * L : (i + 1) * L], k, v)
        out.append(o_i)
        dq.append(dq_i)
        dk, dv = dk + dk_i, dv + dv_i
    np.testing.assert_allclose(jnp.concatenate(out, 1), ref, atol=2e-5, rtol=2e-5)
    for got, w in zip((jnp.concatenate(dq, 1), dk, dv), want):
        np.testing.assert_allclose(got, w, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("shards,documents", [(1, True), (2, True), (3, False), (4, True)])
def test_zigzag_rows_equal_the_whole_sequences_rows_at_their_positions(shards, documents):
    """``zigzag_rows`` (a device's early and late chunk after the swap, the 2n - 1 key chunks
    before them in one call, the two diagonals in another, merged per chunk) on XLA blocks: for
    every device, the values and gradients of q, k and v equal causal ``attention_reference``
    over the whole sequence at the device's ``positions``, index traced, GQA, documents; the
    chunks of all devices cover every position once, and each device attends 2n h^2 pairs."""
    from kernels_pallas.attention import shard_rows, zigzag

    B, H, G, D, L = 2, 4, 2, 16, 12
    T, h = shards * L, L // 2
    pos = zigzag.positions(T, shards)
    assert sorted(pos.tolist()) == list(range(T))
    work = [sum(c * h + (h + 1) / 2 for c in zigzag.chunks(j, shards)) for j in range(shards)]
    assert max(work) == min(work)  # (query, key) pairs a device: the same on every one
    q, k, v = qkv(B, T, H, G, D, seed=17)
    dy = qkv(B, T, H, G, D, seed=18)[0]
    seg = _documents(B, T, seed=19) if documents else None

    def whole(q, k, v):
        o = attention_reference(q, k, v, causal=True, segment_ids=seg)
        return jnp.sum(o * dy), o

    want, ref = jax.grad(whole, argnums=(0, 1, 2), has_aux=True)(q, k, v)

    @jax.jit
    def device(j, rows, q_rows, k, v):
        q_seg = None if seg is None else seg[:, rows]

        def loss(q_rows, k, v):
            o = zigzag.zigzag_rows(q_rows, k, v, j, shards=shards, segment_ids=q_seg,
                                   kv_segment_ids=seg, blocks=shard_rows.REFERENCE)  # fmt: skip
            return jnp.sum(o * dy[:, rows]), o

        return jax.grad(loss, argnums=(0, 1, 2), has_aux=True)(q_rows, k, v)

    out, dq, dk, dv = jnp.zeros_like(ref), jnp.zeros_like(q), jnp.zeros_like(k), jnp.zeros_like(v)
    for j in range(shards):
        rows = jnp.asarray(pos[j * L : (j + 1) * L])
        np.testing.assert_array_equal(zigzag.rows(q, jnp.int32(j), shards), q[:, rows])
        (dq_j, dk_j, dv_j), o_j = device(jnp.int32(j), rows, q[:, rows], k, v)
        out, dq = out.at[:, rows].set(o_j), dq.at[:, rows].set(dq_j)
        dk, dv = dk + dk_j, dv + dv_j
    np.testing.assert_allclose(out, ref, atol=2e-5, rtol=2e-5)
    for got, w in zip((dq, dk, dv), want):
        np.testing.assert_allclose(got, w, atol=2e-5, rtol=2e-5)


def test_shard_rows_finds_jaxs_private_cudnn_rules_as_it_calls_them():
    """The cuDNN blocks call JAX's private rules by position; this JAX has them with those
    parameters (a JAX that changes them makes ``attention`` compute every query instead)."""
    from kernels_pallas.attention import shard_rows

    assert shard_rows.supported()


@pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 devices (XLA_FLAGS fakes them on CPU)")
@pytest.mark.parametrize("window, balance", [(None, True), (None, False), (20, True)])
def test_cudnn_over_a_sequence_axis_runs_each_devices_rows(monkeypatch, window, balance):
    """With impl="cudnn" over a sequence axis, each device runs ``shard_rows`` on its own queries
    (the scores are [T / n, ...], not [T, T]) inside the shard_map, or causal without a window
    ``zigzag_rows`` on its swapped halves (diagonal blocks of T / 2n), and the values and
    gradients equal one device's reference; the XLA blocks stand in for cuDNN's, which a CPU
    lacks."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from hwh_jax.training.sharding import make_mesh
    from kernels_pallas import kernel_mesh
    from kernels_pallas.attention import shard_rows

    monkeypatch.setattr(shard_rows, "CUDNN", shard_rows.REFERENCE)
    monkeypatch.setattr(shard_rows, "supported", lambda: True)
    mesh = make_mesh((2, 1, 1, 4))
    B, T, H, G, D = 2, 64, 4, 2, 16
    q, k, v = qkv(B, T, H, G, D, seed=10)
    dy = qkv(B, T, H, G, D, seed=11)[0]
    seg = _documents(B, T, seed=12)

    def f(settings, q, k, v, seg):
        attn = functools.partial(attention, window=window, segment_ids=seg, settings=settings)
        loss = lambda q, k, v: jnp.sum(attn(q, k, v) * dy)
        return jax.value_and_grad(loss, argnums=(0, 1, 2))(q, k, v)

    want = jax.jit(functools.partial(f, AttentionSettings(impl="reference")))(q, k, v, seg)
    split = NamedSharding(mesh, P("data", "sequence"))
    args = [jax.device_put(a, split) for a in (q, k, v, seg)]
    cudnn = functools.partial(f, AttentionSettings(impl="cudnn", balance=balance))
    with kernel_mesh(mesh):
        jaxpr = str(jax.make_jaxpr(cudnn)(*args))
        got = jax.jit(cudnn)(*args)
    assert "shard_map" in jaxpr
    swapped = window is None and balance
    diagonal = "f32[2,2,2,8,8]" if swapped else "f32[1,2,2,16,16]"  # a row's two, or its one
    assert diagonal in jaxpr and "f32[1,2,2,64,64]" not in jaxpr  # no [T, T]
    assert ("ppermute" in jaxpr) == swapped
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(a, b, atol=2e-5, rtol=2e-5)
