r"""Evaluate trained runs: ``python -m launch.eval --checkpoint=runs/a,runs/b --suite=niah,ppl``.

Writes, under ``--out`` (default ``<first checkpoint>/eval``): one folder per run with its
``results.json``, NIAH heatmaps (depth x length per task) and perplexity by position, plus the
cross-model extrapolation chart and perplexity chart. The logic is ``hwh_jax.eval.suite``.
"""
import json
from pathlib import Path

from absl import app, flags

from launch import setup_logging

flags.DEFINE_list("checkpoint", None, "launch.train workdir(s), comma-separated")
flags.DEFINE_list("suite", ["niah", "ppl"], "any of niah, mqar, ppl, retrieval, commonsense")
flags.DEFINE_string("out", "", "output folder (default <first checkpoint>/eval)")
flags.DEFINE_integer("step", None, "checkpoint step (default: the newest)")
flags.DEFINE_list("niah_tasks", ["niah_single_1", "niah_single_2", "niah_single_3"], "")
flags.DEFINE_list("niah_factors", ["1", "2", "4"], "NIAH lengths as multiples of training length")
flags.DEFINE_integer("niah_depths", 5, "evenly spaced needle depths (RULER uses 40)")
flags.DEFINE_integer("niah_samples", 1, "samples per (length, depth)")
flags.DEFINE_integer("ppl_factor", 4, "perplexity windows of this many training lengths")
flags.DEFINE_string("ppl_text", "", "text file for perplexity (default: the run's held-out split)")
flags.DEFINE_list("commonsense_tasks", None, "default: all seven")
flags.DEFINE_integer("commonsense_limit", 0, "first N examples per task (0 = all)")
flags.DEFINE_integer("mqar_examples", 64, "sequences per MQAR setting")
flags.DEFINE_integer("batch_size", 8, "sequences per forward / generate call")
flags.mark_flags_as_required(["checkpoint"])
FLAGS = flags.FLAGS


def main(argv):
    del argv
    setup_logging()
    from hwh_jax.eval import suite
    from hwh_jax.eval.commonsense import TASKS
    from hwh_jax.training.restore import load_run
    spec = suite.EvalSpec(
        suites=tuple(FLAGS.suite), batch_size=FLAGS.batch_size,
        niah_tasks=tuple(FLAGS.niah_tasks), niah_factors=tuple(float(f) for f in FLAGS.niah_factors),
        niah_depths=FLAGS.niah_depths, niah_samples=FLAGS.niah_samples,
        ppl_factor=FLAGS.ppl_factor, ppl_text=FLAGS.ppl_text,
        commonsense_tasks=tuple(FLAGS.commonsense_tasks or TASKS),
        commonsense_limit=FLAGS.commonsense_limit, mqar_examples=FLAGS.mqar_examples)
    spec.validate()  # before loading anything
    out = Path(FLAGS.out or Path(FLAGS.checkpoint[0]) / "eval")
    results = []
    for i, ckpt in enumerate(FLAGS.checkpoint):
        run = load_run(ckpt, FLAGS.step)
        print(f"== {run.name} (step {run.step})", flush=True)
        results.append(suite.run_suite(run, spec, out / f"{i}_{run.name.replace('@', '_')}"))
    suite.compare(results, out)
    (out / "summary.json").write_text(json.dumps(
        [{k: r[k] for k in r if k not in ("niah",)} for r in results], indent=2))
    print(f"results and plots in {out}", flush=True)


if __name__ == "__main__":
    app.run(main)
