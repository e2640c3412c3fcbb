r"""Retrieval heads over a run's checkpoints: when each full-attention head becomes one.

  python -m launch.trace_retrieval --checkpoint=runs/swa_nope_small --qr_samples=16
  python -m launch.trace_retrieval --checkpoint=RUN --steps=1000,2000,4000 --threshold=0.2

At every kept checkpoint of the run (or ``--steps``), each FA head's QRscore on the same NIAH
prompts (the mass from the answer position onto the needle value, ``launch.analyze``'s probe),
and the first step at which it reaches ``--threshold``. Keep enough checkpoints while training
(``--config.train.checkpoint_every`` and ``--config.train.keep_checkpoints``). Writes under
``--out`` (default ``<run>/retrieval_trace``): ``trace.json`` (steps, and per head its scores
and first step) and ``trace.png``. The logic is ``hwh_jax.analysis.trace``.
"""

import json

from absl import flags

from hwh_jax import storage
from launch import begin, first_process_writes, one_line_errors, run_main

flags.DEFINE_string("checkpoint", None, "a launch.train workdir")
flags.DEFINE_list("steps", None, "checkpoint steps (default: every one kept)")
flags.DEFINE_integer("qr_samples", 8, "NIAH prompts (needle depths spread over 0-100%)")
flags.DEFINE_integer("seq_len", 0, "prompt length in tokens (default: the run's seq_len)")
flags.DEFINE_float("threshold", 0.1, "QRscore at which a head counts as a retrieval head")
flags.DEFINE_string("out", "", "output folder")
flags.mark_flags_as_required(["checkpoint"])
FLAGS = flags.FLAGS


def main(argv):
    del argv
    begin()
    with one_line_errors():
        with first_process_writes(
            FLAGS.out or storage.path(FLAGS.checkpoint) / "retrieval_trace"
        ) as out:
            trace(out)


def trace(out: storage.PathLike):
    from hwh_jax.analysis import plots
    from hwh_jax.analysis.run import qr_scores
    from hwh_jax.analysis.trace import trace_table
    from hwh_jax.eval import niah
    from hwh_jax.training.checkpoint import Checkpointer
    from hwh_jax.training.restore import load_run

    if FLAGS.qr_samples < 1:
        raise ValueError(f"--qr_samples must be >= 1, got {FLAGS.qr_samples}")
    ckpt = Checkpointer(FLAGS.checkpoint, writer=False)
    try:
        kept = ckpt.steps()
    finally:
        ckpt.close()
    steps = sorted(int(s) for s in FLAGS.steps) if FLAGS.steps else kept
    missing = sorted(set(steps) - set(kept))
    if missing or not steps:
        raise ValueError(f"--steps {missing or steps}: the run keeps checkpoints {kept}")
    scores, prompts, name = [], None, None
    for i, step in enumerate(steps):
        run = load_run(FLAGS.checkpoint, step)
        if prompts is None:
            seq_len = FLAGS.seq_len or run.train.seq_len
            prompts, spans = niah.needle_prompts(run.tokenizer, seq_len, FLAGS.qr_samples)
            name = run.name
        scores.append(qr_scores(run.model, prompts, spans, log=lambda s: None))
        if not scores[0]:
            raise ValueError(f"{FLAGS.checkpoint}: the model has no full-attention heads")
        print(
            f"[{i + 1}/{len(steps)}] step {step}: QRscore by layer "
            + "; ".join(
                f"{l}: " + " ".join(f"{v:.2f}" for v in s) for l, s in sorted(scores[-1].items())
            ),
            flush=True,
        )
    rows = trace_table(steps, scores, FLAGS.threshold)
    out.mkdir(parents=True, exist_ok=True)
    (out / "trace.json").write_text(
        json.dumps(
            {
                "run": name,
                "steps": steps,
                "threshold": FLAGS.threshold,
                "prompts": len(prompts),
                "seq_len": seq_len,
                "heads": rows,
            },
            indent=1,
        )
    )
    plots.retrieval_trace(
        steps,
        rows,
        FLAGS.threshold,
        out / "trace.png",
        f"{name}: retrieval heads over training ({len(prompts)} NIAH prompts, {seq_len} tokens)",
    )
    formed = [r for r in rows if r["first_step"] is not None]
    print(
        f"{len(formed)} of {len(rows)} FA heads reach QRscore {FLAGS.threshold:g}: "
        + (", ".join(f"L{r['layer']}H{r['head']}@{r['first_step']}" for r in formed) or "none")
        + f"; trace in {out}",
        flush=True,
    )


if __name__ == "__main__":
    run_main(main)
