"""Frequency analysis: vectorised RFIS/RPD == brute force, decomposition == logits, taxonomy,
capture numerics, and Hugging Face Qwen3 / Llama 3.1 import parity with transformers."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from hwh_jax.analysis import probes, taxonomy
from hwh_jax.analysis.capture import capture_qk
from hwh_jax.analysis.frequency import contributions, rfis_rpd, sample_queries
from hwh_jax.layers.rope import apply_rope, rope_frequencies, split_pairs
from hwh_jax.models import HybridLM, model_config


def _brute(q, k, qidx, w, scale, q_per_kv, pairing):
    """float64 loops over (sample, head, query, frequency), 2x2 rotation matrices."""
    N, T, H, D = q.shape
    F = D // 2
    rfis, rpd = np.zeros((H, F)), np.zeros((H, F))

    def pair(x, r):
        return (
            np.array([x[r], x[r + F]]) if pairing == "half" else np.array([x[2 * r], x[2 * r + 1]])
        )

    def sm(z):
        e = np.exp(z - z.max())
        return e / e.sum()

    def js(a, b):
        m = (a + b) / 2
        kl = lambda x: sum(xi * np.log(xi / mi) for xi, mi in zip(x, m) if xi > 0)
        return (kl(a) + kl(b)) / 2 / np.log(2)

    for n in range(N):
        for h in range(H):
            g = h // q_per_kv
            for i in qidx[n]:
                c = np.zeros((F, i + 1))
                c0 = np.zeros((F, i + 1))
                for r in range(F):
                    for j in range(i + 1):
                        t = (j - i) * w[r]
                        R = np.array([[np.cos(t), -np.sin(t)], [np.sin(t), np.cos(t)]])
                        qa, ka = pair(q[n, i, h], r), pair(k[n, j, g], r)
                        c[r, j], c0[r, j] = qa @ R @ ka, qa @ ka
                z = scale * c.sum(0)
                p = sm(z)
                for r in range(F):
                    rfis[h, r] += js(p, sm(z - scale * c[r])) / (N * len(qidx[n]))
                    rpd[h, r] += js(p, sm(z - scale * c[r] + scale * c0[r])) / (N * len(qidx[n]))
    return rfis, rpd


@pytest.mark.parametrize("pairing,q_per_kv", [("half", 2), ("interleaved", 1)])
def test_rfis_rpd_equal_brute_force_float64(pairing, q_per_kv):
    rng = np.random.default_rng(0)
    N, T, H, D = 2, 12, 4, 8
    q = rng.standard_normal((N, T, H, D)) * 1.5
    k = rng.standard_normal((N, T, H // q_per_kv, D)) * 1.5
    qidx = sample_queries(rng, N, T, 5, min_pos=1)
    w = 100.0 ** (-np.arange(0, D, 2) / D)
    with jax.enable_x64(True):
        a, b = rfis_rpd(
            jnp.asarray(q),
            jnp.asarray(k),
            jnp.asarray(qidx),
            jnp.asarray(w),
            scale=D**-0.5,
            q_per_kv=q_per_kv,
            pairing=pairing,
            chunk=2,
        )
        a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == np.float64
    ra, rb = _brute(q, k, qidx, w, D**-0.5, q_per_kv, pairing)
    np.testing.assert_allclose(a, ra, atol=1e-6, rtol=0)
    np.testing.assert_allclose(b, rb, atol=1e-6, rtol=0)
    assert (a >= 0).all() and (a <= 1).all() and (b >= 0).all() and (b <= 1).all()
    assert a.max() > 1e-3 and b.max() > 1e-3  # not trivially zero


@pytest.mark.parametrize("pairing", ["half", "interleaved"])
def test_contributions_sum_back_to_the_models_logits(pairing):
    cfg = model_config(
        "transformer", "tiny", dtype="float32", q_per_kv=2, rope_pairing=pairing, rope_theta=500.0
    )
    model = HybridLM(cfg, rngs=nnx.Rngs(1))
    x = jnp.asarray(np.random.default_rng(0).integers(0, cfg.vocab_size, (1, 24)), jnp.int32)
    layers, logits = capture_qk(model, x)
    np.testing.assert_array_equal(np.asarray(logits), np.asarray(model(x)))  # same numerics
    lq = layers[2]
    c, c0 = contributions(lq.q[0], lq.k[0], lq.frequencies, q_per_kv=2, pairing=pairing)
    pos = jnp.arange(24)
    qr = apply_rope(lq.q, pos, pairing=pairing, frequencies=lq.frequencies)[0]
    kr = jnp.repeat(apply_rope(lq.k, pos, pairing=pairing, frequencies=lq.frequencies)[0], 2, 1)
    z = jnp.einsum("ihd,jhd->hij", qr, kr, precision="highest")
    np.testing.assert_allclose(c.sum(-1), z, atol=1e-5 * float(jnp.abs(z).max()), rtol=0)
    q1, q2 = split_pairs(lq.q[0], pairing)
    k1, k2 = split_pairs(jnp.repeat(lq.k[0], 2, 1), pairing)
    np.testing.assert_allclose(
        c0.sum(-1),
        jnp.einsum("ihr,jhr->hij", q1, k1, precision="highest")
        + jnp.einsum("ihr,jhr->hij", q2, k2, precision="highest"),
        atol=1e-5,
        rtol=1e-5,
    )


def test_low_frequency_head_scores_zero_at_high_frequencies_and_rpd_zero_without_rotation():
    rng = np.random.default_rng(1)
    N, T, H, D = 2, 32, 1, 16
    F = D // 2
    q = np.zeros((N, T, H, D), np.float32)
    k = np.zeros((N, T, H, D), np.float32)
    for arr in (q, k):  # only the two lowest frequency groups (r = F-2, F-1) carry signal
        arr[..., [F - 2, F - 1, D - 2, D - 1]] = rng.standard_normal((N, T, H, 4)) * 3
    qidx = sample_queries(rng, N, T, 8, min_pos=4)
    w = jnp.asarray(rope_frequencies(D, 10000.0))
    a, b = rfis_rpd(jnp.asarray(q), jnp.asarray(k), jnp.asarray(qidx), w, scale=D**-0.5)
    a = np.asarray(a)
    assert a[0, : F - 2].max() < 1e-6 and a[0, F - 2 :].min() > 1e-3
    _, b0 = rfis_rpd(jnp.asarray(q), jnp.asarray(k), jnp.asarray(qidx), jnp.zeros(F), scale=D**-0.5)
    assert np.abs(np.asarray(b0)).max() < 1e-7  # no rotation: removing it changes nothing


def test_gpband_and_taxonomy_on_constructed_profiles():
    F = 32
    w = rope_frequencies(2 * F, 10000.0)
    periods = taxonomy.rotation_periods(w)
    rpd = np.zeros((4, F))
    rpd[:, :12] = 0.3  # strong at high frequencies
    rpd[:, 12:20] = np.linspace(0.2, 0.04, 8)  # the falling edge
    rpd[:, 20:] = 0.001  # rotation no longer matters
    band = taxonomy.gpband([rpd[:2], rpd[2:]], w, train_len=512)
    assert (band.lo, band.hi) == (15, 19) and band.periods == (periods[15], periods[19])
    rfis = np.zeros((2, F))
    rfis[0, 22:] = 1.0  # below the band: retrieval
    rfis[1, :20] = 1.0  # band and higher: positional
    kinds = taxonomy.classify_heads(rfis, band)
    assert [h["kind"] for h in kinds] == ["retrieval", "positional"]
    assert kinds[0]["retrieval_score"] == pytest.approx(1.0)
    assert taxonomy.retrieval_counts([kinds, [], kinds]) == [1, 0, 1]


def test_probes():
    T = 10
    rows = jnp.zeros((1, 2, T)).at[0, 0, 0].set(0.5).at[0, 0, 7].set(0.5)  # query 9: sink + 7
    rows = rows.at[0, 1, 3].set(1.0)  # query 9: far back
    qidx = jnp.asarray([9, 9])
    np.testing.assert_allclose(probes.ld_score(rows, qidx, window=4), [0.5])  # (1 + 0) / 2
    needle = jnp.zeros(T).at[3].set(1.0)
    np.testing.assert_allclose(probes.qr_score(rows, needle), [0.5])


# ------------------------------------------------------------------ Hugging Face import
def _save_random_hf(kind, folder, shard=False):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    common = dict(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    if kind == "qwen3":
        m = Qwen3ForCausalLM(
            Qwen3Config(**common, head_dim=32, tie_word_embeddings=True, rope_theta=1e6)
        )
    else:
        m = LlamaForCausalLM(
            LlamaConfig(
                **common,
                tie_word_embeddings=False,
                rope_theta=5e5,
                rope_scaling={
                    "rope_type": "llama3",
                    "factor": 8.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 32,
                },
            )
        )
    m = m.float().eval()
    with torch.no_grad():
        for p in m.parameters():  # larger than init so that every part matters
            p.normal_(0, 0.2)
    m.save_pretrained(folder, **({"max_shard_size": "40KB"} if shard else {}))
    return m


@pytest.mark.parametrize("kind,shard", [("qwen3", False), ("llama", True)])
def test_hf_import_logits_match_transformers(tmp_path, kind, shard):
    import torch

    from hwh_jax.hf.load import load_hf_checkpoint

    m = _save_random_hf(kind, tmp_path, shard)
    assert (tmp_path / "model.safetensors.index.json").exists() == shard
    toks = np.random.default_rng(0).integers(0, 128, (2, 70))
    with torch.no_grad():
        ref = m(torch.tensor(toks)).logits.numpy()
    model, cfg, _ = load_hf_checkpoint(tmp_path)
    assert cfg.qk_norm == (kind == "qwen3") and cfg.q_per_kv == 2
    assert bool(cfg.rope_scaling) == (kind == "llama") and cfg.tie_embeddings == (kind == "qwen3")
    got = np.asarray(model(jnp.asarray(toks)))
    assert np.abs(got - ref).max() <= 1e-4, np.abs(got - ref).max()


def test_hf_import_rejects_what_it_cannot_place(tmp_path):
    from hwh_jax.hf.load import load_hf_checkpoint

    _save_random_hf("qwen3", tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "model_type": "gpt2"}))
    with pytest.raises(ValueError, match="model_type 'gpt2' is not supported"):
        load_hf_checkpoint(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "tie_word_embeddings": False}))
    with pytest.raises(ValueError, match="lacks 1 parameter"):
        load_hf_checkpoint(tmp_path)


def test_launch_analyze_on_an_hf_checkpoint(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    _save_random_hf("llama", tmp_path / "hf")
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "launch.analyze",
            f"--hf_checkpoint={tmp_path}/hf",
            "--data=random",
            "--seq_len=64",
            "--num_samples=2",
            "--num_queries=4",
            f"--out={tmp_path}/an",
        ],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "GPBand r=" in out.stdout
    folder = tmp_path / "an" / "0_hf"
    res = json.loads((folder / "analysis.json").read_text())
    assert len(res["layers"]) == 2 and res["band"]["train_len"] == 32
    assert all(len(l["rfis"]) == 4 and len(l["rfis"][0]) == 8 for l in res["layers"])
    counts = json.loads((folder / "counts.json").read_text())["fa_heads"]
    assert len(counts) == 2 and all(0 <= c <= 4 for c in counts)
    from hwh_jax.models.schedules import hwh, load_counts

    assert load_counts(str(folder / "counts.json")) == counts  # what model.counts reads
    assert [
        l.num_fa for l in hwh(2, 4, counts=str(folder / "counts.json"), enforce_rules=False)
    ] == counts
    for name in ("heatmap_layer00.png", "heatmap_layer01.png", "retrieval_by_depth.png"):
        assert (folder / name).exists()
    assert (tmp_path / "an" / "gpband.png").exists()


def test_trace_table_finds_each_heads_first_step_at_the_threshold():
    from hwh_jax.analysis.trace import trace_table

    scores = [{1: [0.0, 0.3], 3: [0.05]}, {1: [0.2, 0.1], 3: [0.05]}, {1: [0.05, 0.4], 3: [0.1]}]
    rows = trace_table([100, 200, 400], scores, 0.1)
    assert [(r["layer"], r["head"], r["first_step"]) for r in rows] == [
        (1, 0, 200),
        (1, 1, 100),
        (3, 0, 400),
    ]
    assert rows[0]["scores"] == [0.0, 0.2, 0.05]
    assert trace_table([100, 200], scores[:2], 0.9)[0]["first_step"] is None
    with pytest.raises(ValueError, match="increasing"):
        trace_table([200, 100], scores[:2], 0.1)


def test_nope_heads_are_analysed_without_rotation():
    """The tiny HwH's FA heads are NoPE: their RPD is 0 (removing a rotation they never had
    changes nothing) and their RFIS is not (their channels matter); the taxonomy still runs."""
    from hwh_jax.analysis.run import analyze_model

    cfg = model_config("hwh", "tiny", dtype="float32")
    assert not any(s.fa_rope for s in cfg.layers if s.num_fa)
    model = HybridLM(cfg, rngs=nnx.Rngs(0))
    samples = np.random.default_rng(0).integers(0, cfg.vocab_size, (2, 48))
    out = analyze_model(model, samples, num_queries=4, train_len=48, log=lambda s: None)
    analysed = [l for l in out["layers"] if l["heads"]]
    assert analysed and all(l["rope"] is False for l in analysed)
    for layer in analysed:
        assert np.abs(np.asarray(layer["rpd"])).max() < 1e-7  # float32 rounding only
        assert np.asarray(layer["rfis"]).max() > 1e-5  # untrained: small, not 0
