r"""One experiment of docs/results.md, the same with several seeds, or the report over several.

  python -m launch.experiment --config=configs/experiment.py:hwh,512 --out=$OUT/hwh
  python -m launch.experiment --config=configs/experiment.py:hwh,512 --seeds=0,1,2 \
      --side_by_side=3 --out=$OUT/hwh
  python -m launch.experiment --report=$OUT/transformer,$OUT/hwh,... --out=$OUT/report
  python -m launch.experiment --mixers=gdn,gla,mamba2 --ratios=11,5,3 --length=512 \
      --side_by_side=4 --out=$OUT/grid

With --config: train (the trainer of launch.train) into --out; the config's closing evaluation
(configs/experiment.py: NIAH single 1/2/3 at L, 2L, 4L, MQAR, perplexity by position) writes
``eval/``; then ``experiment.json`` (params, tokens, wall time, tokens/s, MFU, NIAH, MQAR).
With --seeds: one such run per seed (``config.seed``) in ``OUT/seed<N>``, each its own process,
``--side_by_side`` of them at once (small models share one GPU: each process may take an equal
share of its memory), then ``OUT/seeds.json`` and a table over the seeds (``over_seeds``: each
NIAH cell's mean, standard deviation, range and pooled interval). With --report: ``report.md`` (NIAH extrapolation table, runs table), ``experiments.json`` and
the cross-model figures from those runs (a folder of seed runs: each run, and a row over its
seeds). With --mixers and --ratios: the layer-wise hybrid of each linear-head kind at each
ratio R (R linear layers to one RoPE FA layer: ``configs/experiment.py:layerwise/KIND/R,L``),
each a process training into ``OUT/KIND_R``, then the report over them in ``OUT/report.md``
(the ratio grid of the systematic analysis of hybrid linear attention; at the `small` size's
12 layers R is at most 11). The logic is ``hwh_jax.experiments`` (``runner``, ``report``).
"""

import logging
import os
import sys

from absl import app, flags
from ml_collections import config_flags

from hwh_jax.experiments.processes import argv_without
from launch import EXIT_FAILED, devices, one_line_errors, run_main, setup_logging

config_flags.DEFINE_config_file("config", None, "run config file (e.g. configs/experiment.py:hwh)")
flags.DEFINE_string("out", None, "the run's workdir (--config) or the report's folder (--report)")
flags.DEFINE_list("report", [], "experiment workdirs to tabulate instead of training")
flags.DEFINE_list("seeds", [], "train one run per seed into OUT/seed<N> and summarise over them")
flags.DEFINE_integer(
    "side_by_side", 1, "with --seeds or a grid: how many runs train at once (processes)"
)
flags.DEFINE_list("mixers", [], "a grid: linear-head kinds of the layer-wise hybrid")
flags.DEFINE_list("ratios", [], "a grid: linear layers to one FA layer, e.g. 11,5,3")
flags.DEFINE_integer("length", 512, "a grid: the training length L")
flags.DEFINE_bool("cpu", False, "a grid: the CPU-sized preset of each cell (ARCH,L,cpu)")
flags.mark_flags_as_required(["out"])
FLAGS = flags.FLAGS


def main(argv):
    del argv
    if FLAGS.mixers or FLAGS.ratios:
        setup_logging()
        with one_line_errors():
            grid()
        return
    if FLAGS.seeds and FLAGS.config is not None and not FLAGS.report:
        setup_logging()
        with one_line_errors():
            several_seeds()
        return
    started = devices.start() if FLAGS.config is not None and not FLAGS.report else []
    setup_logging(os.path.join(FLAGS.out, "train.log") if FLAGS.config is not None else None)
    for line in started:
        logging.info("%s", line)
    with one_line_errors():
        experiment()


def experiment():
    from hwh_jax.experiments import runner
    from hwh_jax.experiments.report import report

    if FLAGS.report:
        print(report(FLAGS.report, FLAGS.out))
        return
    if FLAGS.config is None:
        raise app.UsageError("give --config (train one experiment) or --report=dir,dir,...")
    if not FLAGS.config.eval.at_end:
        raise app.UsageError("an experiment needs its closing evaluation: config.eval.at_end")
    print(runner.train_and_summarize(FLAGS.config, FLAGS.out)["line"])


def _finish(run):
    """``run()``'s output printed, or its RunsFailed as one line and exit status 1."""
    from hwh_jax.experiments.runner import RunsFailed

    try:
        print(run(), flush=True)
    except RunsFailed as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(EXIT_FAILED)


def grid():
    """The layer-wise hybrid at every (kind, ratio) of --mixers x --ratios, ``--side_by_side``
    processes at a time, then the report over the cells."""
    from configs import experiment
    from hwh_jax.experiments import runner

    cells = runner.grid_cells(
        experiment.get_config, FLAGS.mixers, FLAGS.ratios, FLAGS.length, FLAGS.cpu
    )
    if FLAGS.config is not None or FLAGS.seeds or FLAGS.report:
        raise app.UsageError("a grid (--mixers, --ratios) takes no --config, --seeds or --report")
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")
    config_file = os.path.join(path, "experiment.py")
    _finish(lambda: runner.grid(cells, FLAGS.side_by_side, FLAGS.out, config_file))


def several_seeds():
    """One run per seed, ``--side_by_side`` processes at a time, then the table over seeds."""
    from hwh_jax.experiments import runner

    try:
        seeds = [int(s) for s in FLAGS.seeds]
    except ValueError:
        raise ValueError(f"--seeds must be integers, got {FLAGS.seeds}") from None
    if not FLAGS.config.eval.at_end:
        raise app.UsageError("an experiment needs its closing evaluation: config.eval.at_end")
    child = argv_without(sys.argv[1:], ("seeds", "side_by_side", "out"))
    _finish(lambda: runner.seeds(child, seeds, FLAGS.side_by_side, FLAGS.out))


if __name__ == "__main__":
    run_main(main)
