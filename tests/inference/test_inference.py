"""Inference: cached decoding == the parallel forward, left padding is invisible, sampling."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from hwh_jax.inference import Generator, cache_bytes, sample
from hwh_jax.models import ARCHS, HybridLM, model_config

VOCAB = 256


def tiny(arch, **kw):
    # chunk 8 and window 8: a 13-token prompt crosses GDN chunks and SWA windows
    cfg = model_config(
        arch, "tiny", dtype="float32", la_chunk_size=8, vocab_size=VOCAB, window=8, **kw
    )
    return HybridLM(cfg, rngs=nnx.Rngs(0))


def tokens(B, T, seed=0):
    return jnp.asarray(np.random.default_rng(seed).integers(1, VOCAB, (B, T)), jnp.int32)


@nnx.jit
def _forward(model, x):
    return model(x)


@nnx.jit
def _extend(model, x, cache):
    return model.extend(x, cache)


@pytest.mark.parametrize("arch", ARCHS)
def test_prefill_then_token_by_token_matches_parallel_forward(arch):
    model = tiny(arch)
    x = tokens(2, 24)
    full = _forward(model, x)
    cache = model.init_cache(2, 24)
    logits, cache = _extend(model, x[:, :13], cache)
    outs = [logits]
    for t in range(13, 24):
        logits, cache = _extend(model, x[:, t : t + 1], cache)
        outs.append(logits)
    np.testing.assert_allclose(jnp.concatenate(outs, 1), full, atol=1e-4, rtol=0)
    assert int(cache["t"]) == 24


@pytest.mark.parametrize("arch", ["hwh", "swa", "transformer"])
def test_left_padding_is_invisible(arch):
    """Rows of lengths 5 and 17 in one left-padded batch: each row's logits equal its own
    unpadded forward, in the prompt and in the decoded steps."""
    model = tiny(arch)
    rows = [tokens(1, 9, seed=1)[0], tokens(1, 21, seed=2)[0]]
    prompts = [r[:5] if i == 0 else r[:17] for i, r in enumerate(rows)]
    P = 17
    padded = jnp.stack([jnp.pad(p, (P - len(p), 0)) for p in prompts])
    cache = model.init_cache(2, P + 4, start=[P - len(p) for p in prompts])
    logits, cache = _extend(model, padded, cache)
    steps = [logits[:, -1]]
    for s in range(3):
        nxt = jnp.stack([rows[0][5 + s], rows[1][17 + s]])[:, None]
        logits, cache = _extend(model, nxt, cache)
        steps.append(logits[:, 0])
    for b, (row, n) in enumerate([(rows[0], 5), (rows[1], 17)]):
        ref = _forward(model, row[None, : n + 3])[0]
        np.testing.assert_allclose(
            jnp.stack([s[b] for s in steps]), ref[n - 1 : n + 3], atol=1e-4, rtol=0
        )


@pytest.mark.parametrize("arch", ["hwh", "swa", "transformer", "layerwise"])
def test_fresh_prefill_equals_prefill_over_the_cache(arch):
    """A first chunk attending over itself (``fresh``: the training attention on rows rolled
    past their left padding) against the same chunk over the empty cache: the same logits,
    caches and next decoded steps, with padding of 12, 0 and 3 and a window shorter than the
    prompt (swa). ``last_only`` gives the last logits alone."""
    model = tiny(arch)
    x = tokens(3, 17, seed=4)
    start = [12, 0, 3]
    x = jnp.where(jnp.arange(17)[None] >= jnp.asarray(start)[:, None], x, 0)
    got, c1 = nnx.jit(lambda m, x, c: m.extend(x, c, fresh=True))(
        model, x, model.init_cache(3, 21, start=start)
    )
    want, c2 = _extend(model, x, model.init_cache(3, 21, start=start))
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=0)
    for a, b in zip(jax.tree.leaves(c1), jax.tree.leaves(c2)):
        np.testing.assert_allclose(a, b, atol=2e-5, rtol=0)
    last, _ = nnx.jit(lambda m, x, c: m.extend(x, c, fresh=True, last_only=True))(
        model, x, model.init_cache(3, 21, start=start)
    )
    assert last.shape == (3, 1, VOCAB)
    np.testing.assert_allclose(last[:, 0], want[:, -1], atol=2e-5, rtol=0)
    for t in range(3):
        nxt = tokens(3, 1, seed=10 + t)
        (a, c1), (b, c2) = _extend(model, nxt, c1), _extend(model, nxt, c2)
        np.testing.assert_allclose(a, b, atol=2e-5, rtol=0)


def test_batched_greedy_generation_equals_one_by_one_and_brute_force():
    model = tiny("hwh")
    gen = Generator(model, vocab=VOCAB, length_multiple=16)
    prompts = [tokens(1, 3, seed=3)[0].tolist(), tokens(1, 11, seed=4)[0].tolist()]
    batched, timing = gen.generate(prompts, 6)
    assert timing["padded_prompt"] == 16
    for p, out in zip(prompts, batched):
        assert gen.generate([p], 6)[0][0] == out
        seq = list(p)  # brute force: full forward (right-padded to one shape), argmax, append
        for _ in range(6):
            x = jnp.asarray([seq + [0] * (17 - len(seq))])
            seq.append(int(jnp.argmax(_forward(model, x)[0, len(seq) - 1, :VOCAB])))
        assert seq[len(p) :] == out


def test_generator_keeps_matrices_in_the_compute_dtype_with_the_same_logits():
    cfg = model_config("hwh", "tiny", dtype="bfloat16", la_chunk_size=8, vocab_size=VOCAB)
    model = HybridLM(cfg, rngs=nnx.Rngs(0))
    gen = Generator(model, vocab=VOCAB)
    leaves = jax.tree.leaves(gen.state)
    assert {a.dtype for a in leaves if a.ndim >= 2} == {jnp.dtype(jnp.bfloat16)}
    assert {a.dtype for a in leaves if a.ndim == 1} == {jnp.dtype(jnp.float32)}  # norms, A_log
    assert {a.dtype for a in jax.tree.leaves(nnx.state(model))} == {jnp.dtype(jnp.float32)}
    x = tokens(2, 13)
    want, _ = nnx.jit(lambda m, x, c: m.extend(x, c, last_only=True))(
        model, x, model.init_cache(2, 16)
    )  # the prefill forms the last logits alone
    got, _ = gen.prefill(gen.state, x, model.init_cache(2, 16))
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want[:, -1]))


def test_eos_stops_a_row_and_is_not_returned():
    model = tiny("gdn")
    gen = Generator(model, vocab=VOCAB)
    out = gen.generate([[5, 6, 7]], 8)[0][0]
    stopped = Generator(model, vocab=VOCAB, eos_id=out[2]).generate([[5, 6, 7]], 8)[0][0]
    assert stopped == out[: out.index(out[2])]


def test_sampling():
    logits = jnp.log(jnp.asarray([[0.5, 0.3, 0.2, 0.0]]))
    key = jax.random.key(0)
    assert int(sample(logits, key)[0]) == 0
    assert int(sample(logits, key, temperature=1.0, top_p=0.4)[0]) == 0  # nucleus = {0}
    draws = jax.vmap(lambda k: sample(logits, k, temperature=1.0, top_p=0.75))(
        jax.random.split(key, 2000)
    )[:, 0]
    freq = np.bincount(np.asarray(draws), minlength=4) / 2000
    assert freq[2] == 0 and freq[3] == 0 and abs(freq[0] - 0.625) < 0.04  # {0,1} renormalised
    assert int(sample(jnp.asarray([[0.0, 5.0]]), key, vocab=1)[0]) == 0  # padded row masked
    with pytest.raises(ValueError, match="top_p"):
        sample(logits, key, temperature=1.0, top_p=0.0)


def test_generate_rejects_bad_input():
    gen = Generator(tiny("gdn"), vocab=VOCAB)
    with pytest.raises(ValueError, match="at least one token"):
        gen.generate([[1, 2], []], 4)
    with pytest.raises(ValueError, match="max_new_tokens"):
        gen.generate([[1, 2]], 0)


@pytest.mark.parametrize(
    "arch,kind", [("hwh", "gdn"), ("swa", "gdn"), ("layerwise", "mamba2"), ("gdn", "hgrn")]
)
def test_cache_bytes_are_the_whole_models_cache(arch, kind):
    """cache_bytes (one traced mixer a head split, shared by its layers) against the whole
    model's init_cache traced at once, at batch 3 and two contexts."""
    import jax
    from flax import nnx

    from hwh_jax.models import HybridLM

    cfg = model_config(arch, "small", la_kind=kind)
    model = nnx.eval_shape(lambda: HybridLM(cfg, rngs=nnx.Rngs(0)))
    for ctx in (1000, 4096):
        whole = jax.eval_shape(lambda: model.init_cache(3, ctx))["layers"]
        want = {
            k: sum(x.size * x.dtype.itemsize for l in whole for x in jax.tree.leaves(l[k]))
            for k in ("fa", "la")
        }
        got = cache_bytes(cfg, 3, ctx)
        assert (got["fa"], got["la"], got["total"]) == (
            want["fa"],
            want["la"],
            want["fa"] + want["la"],
        )


def test_cache_memory_by_architecture():
    """Exact for the Transformer (2 x layers x heads x D x context x 2 bytes); HwH holds only
    its FA heads' KV plus a context-independent GDN state; SWA caps at the window."""
    ctx = 32768
    t = cache_bytes(model_config("transformer", "small"), 1, ctx)
    s = model_config("transformer", "small")
    assert t["total"] == 2 * s.num_layers * s.num_heads * s.head_dim * ctx * 2 and t["la"] == 0
    h_cfg = model_config("hwh", "small")
    h = cache_bytes(h_cfg, 1, ctx)
    assert h["fa"] == 2 * sum(h_cfg.fa_heads) * s.head_dim * ctx * 2
    assert h["la"] == cache_bytes(h_cfg, 1, 2 * ctx)["la"] > 0
    assert h["total"] < t["total"] / 4
    w_cfg = model_config("swa", "small")
    grow = cache_bytes(w_cfg, 1, 2 * ctx)["fa"] - cache_bytes(w_cfg, 1, ctx)["fa"]
    global_heads = sum(l.num_fa for l in w_cfg.layers if l.window is None)
    assert 0 < global_heads < sum(w_cfg.fa_heads)
    assert grow == 2 * global_heads * s.head_dim * ctx * 2  # windowed layers do not grow


def test_fixed_cache_and_chunked_prefill_generate_the_same_with_one_compilation(arch="hwh"):
    """cache_len fixed and prompts padded to / prefilled in chunks of 8 (what NIAH uses across
    its lengths): the same greedy tokens as the default generator, and prompts of 3 to 21
    tokens share one compiled prefill and decode."""
    model = tiny(arch)
    plain = Generator(model, vocab=VOCAB, length_multiple=16)
    fixed = Generator(model, vocab=VOCAB, prefill_chunk=8, length_multiple=8, cache_len=30)
    batches = [
        [tokens(1, 3, seed=5)[0].tolist(), tokens(1, 6, seed=6)[0].tolist()],
        [tokens(1, 11, seed=7)[0].tolist(), tokens(1, 21, seed=8)[0].tolist()],
    ]
    for prompts in batches:
        assert fixed.generate(prompts, 6)[0] == plain.generate(prompts, 6)[0]
    # the prefill: one compile for first chunks (fresh), one for the chunks after them
    assert fixed.prefill._cache_size() == 2 and fixed.decode._cache_size() == 1
    assert plain.prefill._cache_size() == 2  # padded lengths 16 and 32, each fresh
    with pytest.raises(
        ValueError, match="padded prompt 24 \\+ 7 new tokens exceed the fixed cache_len 30"
    ):
        fixed.generate(batches[1], 7)


def test_prefill_and_decode_update_the_cache_in_place():
    """The cache is donated to the compiled prefill and decode (one copy alive, not two): the
    arrays passed in are consumed."""
    gen = Generator(tiny("hwh"), vocab=VOCAB)
    cache = gen._init(gen.state, jnp.zeros((1,), jnp.int32), batch=1, max_len=16)
    logits, cache2 = gen.prefill(gen.state, jnp.asarray([[5, 6, 7, 8]], jnp.int32), cache)
    assert all(a.is_deleted() for a in jax.tree.leaves(cache))
    gen.decode(gen.state, logits, cache2, jax.random.key(0), steps=2, temperature=0.0, top_p=1.0)
    assert all(a.is_deleted() for a in jax.tree.leaves(cache2))


def test_decode_step_bytes_count_weights_and_cache_by_hand():
    """The memory floor of a decode step (``hwh_jax.inference.roofline``) for the tiny
    Transformer in bf16, counted by hand: the tied table and every block's matrices in bf16, the
    norm scales in fp32; the K and V cache read whole, one slot written; HwH's GDN states read
    and written; an untied table costs only the looked-up rows."""
    from hwh_jax.inference import Generator
    from hwh_jax.inference.roofline import decode_step_bytes, floor_ms, peak_memory_bandwidth

    cfg = model_config("transformer", "tiny", dtype="bfloat16")
    d, L, mlp, V, HD = cfg.d_model, len(cfg.layers), cfg.mlp_hidden, cfg.vocab_size, 8 * 16
    state = Generator(HybridLM(cfg, rngs=nnx.Rngs(0))).state
    B, T = 2, 64
    got = decode_step_bytes(state, cfg, B, T)
    weights = 2 * (V * d + L * (4 * d * HD + 3 * d * mlp)) + 4 * (2 * L + 1) * d
    kv = L * 2 * B * T * HD * 2  # K and V, bf16
    assert got == {
        "weights": weights,
        "cache_read": kv,
        "cache_written": kv // T,
        "total": weights + kv + kv // T,
    }
    untied = cfg.replace(tie_embeddings=False)
    u = decode_step_bytes(Generator(HybridLM(untied, rngs=nnx.Rngs(0))).state, untied, B, T)
    assert u["weights"] == weights + 2 * B * d  # the head's matrix, B rows of the table
    hwh = model_config("hwh", "tiny", dtype="bfloat16")
    h = decode_step_bytes(Generator(HybridLM(hwh, rngs=nnx.Rngs(0))).state, hwh, B, T)
    states = sum(s.num_la for s in hwh.layers) * B * hwh.la_key_dim * hwh.la_value_dim * 4
    c = cache_bytes(hwh, B, T)  # the GDN states (fp32) and conv tails
    assert c["la"] > states and h["cache_written"] == c["la"] + c["fa"] // T
    assert h["total"] == h["weights"] + c["fa"] + c["fa"] // T + 2 * c["la"]
    assert peak_memory_bandwidth("NVIDIA H200") == 4.8e12 and peak_memory_bandwidth("cpu") is None
    assert floor_ms(4.8e9, 4.8e12) == 1.0 and floor_ms(1.0, None) is None
    from hwh_jax.inference.roofline import floor_table

    lines = floor_table({"transformer": cfg}, T, [B], 1e9).splitlines()  # 1 GB/s: ms = MB
    assert lines[0].count("|") == lines[1].count("|") == lines[2].count("|") == 4
    assert lines[2] == f"| transformer | {got['total'] / 1e9:.3f} | {got['total'] / 1e6:.3f} |"
