"""The whole analysis of one model: capture q/k on samples, RFIS / RPD per layer, GPBand,
head taxonomy, retrieval-head counts (an ``hwh`` allocation), and optional probes.

Samples are processed one at a time (capture, then every layer's scores), so memory holds one
sample's q/k and one chunk of queries' scores; results are means over samples (each weighted
equally) of means over that sample's sampled queries.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from hwh_jax.analysis import probes, taxonomy
from hwh_jax.analysis.capture import capture_qk
from hwh_jax.analysis.frequency import rfis_rpd, sample_queries
from hwh_jax.progress import Progress


def analyze_model(
    model,
    samples: np.ndarray,
    *,
    num_queries: int,
    train_len: int | None,
    chunk: int = 16,
    seed: int = 0,
    min_pos: int = 16,
    ld_window: int = 64,
    log=print,
) -> dict:
    """samples [N, T] token ids -> {"layers": [...], "band": ..., "counts": [...]}."""
    N, T = samples.shape
    graphdef, state = nnx.split(model)
    capture = jax.jit(lambda st, x: capture_qk(nnx.merge(graphdef, st), x)[0])
    qidx = sample_queries(np.random.default_rng(seed), N, T, num_queries, min(min_pos, T - 1))
    acc, progress = {}, Progress(N, "analysis", unit="sample")
    for n in range(N):
        for lq in capture(state, jnp.asarray(samples[n : n + 1])):
            idx = jnp.asarray(qidx[n : n + 1])
            # NoPE heads rotate nothing: their decomposition uses angle 0, so z is their own
            # logits, RFIS scores their channel pairs and RPD is 0 (docs/analysis.md)
            turn = lq.frequencies if lq.rope else jnp.zeros_like(lq.frequencies)
            a, b = rfis_rpd(
                lq.q,
                lq.k,
                idx,
                turn,
                scale=lq.scale,
                q_per_kv=lq.q_per_kv,
                pairing=lq.pairing,
                chunk=chunk,
            )
            rows = probes.attention_rows(
                lq.q[0],
                lq.k[0],
                idx[0],
                lq.frequencies,
                rope=lq.rope,
                scale=lq.scale,
                q_per_kv=lq.q_per_kv,
                pairing=lq.pairing,
            )
            ld = probes.ld_score(rows, idx[0], window=ld_window)
            s = acc.setdefault(lq.layer, {"rfis": 0.0, "rpd": 0.0, "ld": 0.0, "meta": lq})
            s["rfis"], s["rpd"], s["ld"] = s["rfis"] + a / N, s["rpd"] + b / N, s["ld"] + ld / N
        progress.update()
    progress.close()
    if not acc:
        raise ValueError("the model has no FA heads to analyse")
    freqs = np.asarray(next(iter(acc.values()))["meta"].frequencies)
    rotated = [s for s in acc.values() if s["meta"].rope]  # the band: RoPE heads' RPD
    band = taxonomy.gpband(
        [np.asarray(s["rpd"]) for s in (rotated or acc.values())], freqs, train_len=train_len
    )
    layers = []
    for l in range(len(model.blocks)):
        if l not in acc:
            layers.append({"layer": l, "heads": 0, "taxonomy": []})
            continue
        s = acc[l]
        tax = taxonomy.classify_heads(np.asarray(s["rfis"]), band)
        for h, ld in zip(tax, np.asarray(s["ld"]).tolist()):
            h["ld_score"] = ld
        layers.append(
            {
                "layer": l,
                "heads": len(tax),
                "rope": s["meta"].rope,
                "rfis": np.asarray(s["rfis"]).tolist(),
                "rpd": np.asarray(s["rpd"]).tolist(),
                "taxonomy": tax,
            }
        )
    counts = taxonomy.retrieval_counts([l["taxonomy"] for l in layers])
    return {
        "layers": layers,
        "band": band.as_dict(),
        "counts": counts,
        "frequencies": freqs.tolist(),
        "periods": taxonomy.rotation_periods(freqs).tolist(),
        "samples": N,
        "seq_len": T,
        "queries_per_sample": num_queries,
    }


def qr_scores(model, prompts, needle_spans, *, log=print) -> list[np.ndarray]:
    """QRscore [H] per FA layer: mass from each prompt's last position onto its needle span.

    prompts: list of token lists (NIAH-style, ending where the answer starts);
    needle_spans: list of (start, end) token ranges of the needle value in each prompt."""
    total = {}
    for ids, (a, b) in zip(prompts, needle_spans):
        x = jnp.asarray([ids])
        layers, _ = capture_qk(model, x)
        mask = jnp.zeros(len(ids)).at[a:b].set(1.0)
        for lq in layers:
            rows = probes.attention_rows(
                lq.q[0],
                lq.k[0],
                jnp.asarray([len(ids) - 1]),
                lq.frequencies,
                rope=lq.rope,
                scale=lq.scale,
                q_per_kv=lq.q_per_kv,
                pairing=lq.pairing,
            )
            total[lq.layer] = total.get(lq.layer, 0.0) + probes.qr_score(rows, mask) / len(prompts)
    log(f"QRscore over {len(prompts)} NIAH prompts")
    return {l: np.asarray(v) for l, v in total.items()}
