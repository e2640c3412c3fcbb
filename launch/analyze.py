r"""Frequency-intervention analysis of RoPE models (RFIS, RPD, GPBand, head taxonomy).

  python -m launch.analyze --checkpoint=runs/transformer_small_512,runs/transformer_small_1024
  python -m launch.analyze --hf_checkpoint=/models/Qwen3-0.6B --seq_len=4096 --train_len=32768

Writes under ``--out`` (default ``<first model>/analysis``), per model: ``analysis.json`` (RFIS,
RPD, taxonomy, band, probes), ``counts.json`` ({"fa_heads": [...]}: retrieval heads per layer,
usable as ``--config.model.counts=<path>`` of an ``hwh`` config), RFIS/RPD heatmaps per layer,
``retrieval_by_depth.png``; and for all models together ``gpband.png``.
"""

import json

from absl import app, flags

from hwh_jax import storage
from launch import begin, first_process_writes, one_line_errors, run_main

flags.DEFINE_list("checkpoint", [], "launch.train workdir(s)")
flags.DEFINE_list("hf_checkpoint", [], "Hugging Face folder(s) (config.json + safetensors)")
HF_HELDOUT = "wikitext2/test.txt.gz"  # the shipped text an imported model is scored on
flags.DEFINE_string(
    "data",
    "heldout",
    "'heldout' (a project run's held-out split; for an "
    f"imported model the shipped {HF_HELDOUT}), 'random' (uniform token ids), "
    "or a text file (shipped data, absolute, or under the data dir)",
)
flags.DEFINE_integer("seq_len", 0, "tokens per sample (default: the run's seq_len; HF: 1024)")
flags.DEFINE_integer(
    "train_len",
    0,
    "training length to mark (default: the run's seq_len; HF: "
    "original_max_position_embeddings or max_position_embeddings)",
)
flags.DEFINE_integer("num_samples", 8, "samples (each weighted equally)")
flags.DEFINE_integer("num_queries", 32, "query positions sampled per sample")
flags.DEFINE_integer("chunk", 16, "queries scored at once (memory: chunk x heads x F x seq_len)")
flags.DEFINE_integer("qr_samples", 0, "NIAH prompts for QRscore (project runs; 0 = skip)")
flags.DEFINE_string("out", "", "output folder")
flags.DEFINE_integer("seed", 0, "sampling seed")
FLAGS = flags.FLAGS


def _load(kind, path):
    if kind == "hf":
        from hwh_jax.hf.load import load_hf_checkpoint

        model, cfg, hf = load_hf_checkpoint(path)
        tok = None
        if (storage.path(path) / "tokenizer.json").exists():
            from tokenizers import Tokenizer

            t = Tokenizer.from_file(str(storage.path(path) / "tokenizer.json"))
            tok = type(
                "HFTok",
                (),
                {"encode": lambda self, s: t.encode(s).ids, "vocab_size": t.get_vocab_size()},
            )()
        scaling = dict(cfg.rope_scaling)
        train_len = int(
            scaling.get("original_max_position_embeddings")
            or hf.get("max_position_embeddings")
            or 0
        )
        return model, cfg, tok, train_len, None, storage.path(path).name
    from hwh_jax.training.restore import load_run

    run = load_run(path)
    return run.model, run.model_cfg, run.tokenizer, run.train.seq_len, run, run.name


def _samples(tok, run, seq_len, n, rng, cfg):
    import numpy as np

    if FLAGS.data == "random":
        return rng.integers(0, cfg.vocab_size, (n, seq_len)).astype(np.int32)
    data = FLAGS.data
    if data == "heldout" and run is None:
        data = HF_HELDOUT  # an imported model has no held-out split of its own
    if data == "heldout":
        stream = run.heldout_stream()
    else:
        from hwh_jax.data.paths import resolve
        from hwh_jax.data.sources import read_text

        p = resolve(data)
        if tok is None:
            raise ValueError(f"no tokenizer for this model to read {p}; use --data=random")
        stream = np.asarray(tok.encode(read_text(p)), np.int32)
    if len(stream) < n * seq_len:
        raise ValueError(
            f"--data={FLAGS.data}: {len(stream)} tokens < --num_samples={n} x --seq_len={seq_len}; "
            f"lower one of them (at most {len(stream) // seq_len} samples of {seq_len}) or pass a "
            "longer text as --data"
        )
    starts = rng.choice(len(stream) // seq_len, n, replace=False) * seq_len
    return np.stack([stream[s : s + seq_len] for s in starts])


def main(argv):
    del argv
    begin()
    with one_line_errors():
        analyze()


def analyze():
    models = [("run", p) for p in FLAGS.checkpoint] + [("hf", p) for p in FLAGS.hf_checkpoint]
    if not models:
        raise app.UsageError("give --checkpoint and/or --hf_checkpoint")
    # several processes: each computes everything on its own devices, the first writes
    with first_process_writes(FLAGS.out or storage.path(models[0][1]) / "analysis") as out:
        _analyze(models, out)


def _analyze(models, out: storage.PathLike):
    import numpy as np

    from hwh_jax.analysis import plots
    from hwh_jax.analysis.run import analyze_model, qr_scores

    results = {}
    for i, (kind, path) in enumerate(models):
        model, cfg, tok, train_len, run, name = _load(kind, path)
        train_len = FLAGS.train_len or train_len or None
        seq_len = FLAGS.seq_len or (run.train.seq_len if run else 1024)
        rng = np.random.default_rng(FLAGS.seed)
        samples = _samples(tok, run, seq_len, FLAGS.num_samples, rng, cfg)
        print(
            f"== {name}: {FLAGS.num_samples} samples x {seq_len} tokens, "
            f"{FLAGS.num_queries} queries each",
            flush=True,
        )
        res = analyze_model(
            model,
            samples,
            num_queries=FLAGS.num_queries,
            train_len=train_len,
            chunk=FLAGS.chunk,
            seed=FLAGS.seed,
        )
        if FLAGS.qr_samples and tok is not None:
            from hwh_jax.eval import niah

            prompts, spans = niah.needle_prompts(tok, seq_len, FLAGS.qr_samples)
            qr = qr_scores(model, prompts, spans)
            for layer in res["layers"]:
                for h in layer["taxonomy"]:
                    h["qr_score"] = float(qr[layer["layer"]][h["head"]])
        folder = out / f"{i}_{name.replace('@', '_')}"
        folder.mkdir(parents=True, exist_ok=True)
        res["model"] = name
        (folder / "analysis.json").write_text(json.dumps(res, indent=1))
        (folder / "counts.json").write_text(json.dumps({"fa_heads": res["counts"]}))
        plots.layer_heatmaps(res, folder / "heatmap", name)
        plots.retrieval_by_depth(res, folder / "retrieval_by_depth.png", name)
        b = res["band"]
        print(
            f"{name}: GPBand r={b['lo']}..{b['hi']} (periods {b['periods'][0]:.0f}.."
            f"{b['periods'][1]:.0f} tokens; training length {train_len}); retrieval heads per "
            f"layer {res['counts']}",
            flush=True,
        )
        results[name] = res
    plots.band_profile(results, out / "gpband.png")
    print(f"analysis in {out}", flush=True)


if __name__ == "__main__":
    run_main(main)
