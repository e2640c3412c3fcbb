r"""One experiment of docs/results.md, or the report over several.

  python -m launch.experiment --config=configs/experiment.py:hwh,512 --out=$OUT/hwh
  python -m launch.experiment --report=$OUT/transformer,$OUT/hwh,... --out=$OUT/report

With --config: train (the trainer of launch.train) into --out; the config's closing evaluation
(configs/experiment.py: NIAH single 1/2/3 at L, 2L, 4L, MQAR, perplexity by position) writes
``eval/``; then ``experiment.json`` (params, tokens, wall time, tokens/s, MFU, NIAH, MQAR).
With --report: ``report.md`` (NIAH extrapolation table, runs table), ``experiments.json`` and
the cross-model figures from those runs. The logic is ``hwh_jax.eval.report``.
"""
import json
import os

from absl import app, flags
from ml_collections import config_flags

from launch import one_line_errors, setup_logging

config_flags.DEFINE_config_file("config", None, "run config file (e.g. configs/experiment.py:hwh)")
flags.DEFINE_string("out", None, "the run's workdir (--config) or the report's folder (--report)")
flags.DEFINE_list("report", [], "experiment workdirs to tabulate instead of training")
flags.mark_flags_as_required(["out"])
FLAGS = flags.FLAGS


def main(argv):
    del argv
    with one_line_errors():
        experiment()


def experiment():
    setup_logging(os.path.join(FLAGS.out, "train.log") if FLAGS.config is not None else None)
    from hwh_jax.eval.report import report, summarize
    if FLAGS.report:
        print(report(FLAGS.report, FLAGS.out))
        return
    if FLAGS.config is None:
        raise app.UsageError("give --config (train one experiment) or --report=dir,dir,...")
    if not FLAGS.config.eval.at_end:
        raise app.UsageError("an experiment needs its closing evaluation: config.eval.at_end")
    from hwh_jax.training.trainer import train_and_evaluate
    train_and_evaluate(FLAGS.config, FLAGS.out)
    exp = summarize(FLAGS.out)
    exp_path = os.path.join(FLAGS.out, "experiment.json")
    with open(exp_path, "w") as f:
        json.dump({k: v for k, v in exp.items() if k != "results"}, f, indent=2)
    print(f"experiment {exp['name']} ({exp['arch']}, {exp['params'] / 1e6:.1f}M params, "
          f"{exp['tokens'] / 1e6:.1f}M tokens): NIAH "
          + ", ".join(f"{k} {v:.0f}" for k, v in exp["niah"].items()) + f" -> {exp_path}")


if __name__ == "__main__":
    app.run(main)
