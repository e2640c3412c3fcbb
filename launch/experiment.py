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
12 layers R is at most 11). The logic is ``hwh_jax.eval.report``.
"""

import json
import logging
import os
import sys

from absl import app, flags
from ml_collections import config_flags

from hwh_jax import storage
from launch import EXIT_FAILED, devices, one_line_errors, run_main, setup_logging
from launch.processes import argv_without, run_side_by_side

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


def _tokens(n: int) -> str:
    """4,096 / 1.2M / 10.5B: a token count at a readable scale (never "0.0M")."""
    for unit, size in (("B", 1e9), ("M", 1e6)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return f"{n:,}"


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
    print(
        f"experiment {exp['name']} ({exp['arch']}, {exp['params'] / 1e6:.1f}M params, "
        f"{_tokens(exp['tokens'])} tokens): NIAH "
        + ", ".join(f"{k} {v:.0f}" for k, v in exp["niah"].items())
        + f" -> {exp_path}"
    )


def grid_cells(mixers, ratios, length: int, cpu: bool = False) -> list[tuple[str, str]]:
    """(cell name, config argument) of every (kind, ratio), each checked by building it."""
    from configs import experiment
    from hwh_jax.training.specs import model_for_run

    if not mixers or not ratios:
        raise ValueError("a grid needs both --mixers and --ratios")
    cells = []
    for kind in mixers:
        for ratio in ratios:
            arg = f"layerwise/{kind}/{ratio},{length}" + (",cpu" if cpu else "")
            config = experiment.get_config(arg)  # a bad kind or ratio: refused now, named
            model_for_run(config, 1)  # the schedule: a ratio with no FA layer is refused here
            cells.append((f"{kind}_{ratio}", arg))
    return cells


def grid():
    """The layer-wise hybrid at every (kind, ratio) of --mixers x --ratios, ``--side_by_side``
    processes at a time, then the report over the cells."""
    from hwh_jax.eval.report import report

    cells = grid_cells(FLAGS.mixers, FLAGS.ratios, FLAGS.length, FLAGS.cpu)
    if FLAGS.config is not None or FLAGS.seeds or FLAGS.report:
        raise app.UsageError("a grid (--mixers, --ratios) takes no --config, --seeds or --report")
    out = storage.path(FLAGS.out)
    out.mkdir(parents=True, exist_ok=True)
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")
    env = dict(os.environ)
    if FLAGS.side_by_side > 1:
        env.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", f"{0.9 / FLAGS.side_by_side:.3f}")
    jobs = [
        (
            name,
            [
                sys.executable,
                "-m",
                "launch.experiment",
                f"--config={os.path.join(path, 'experiment.py')}:{arg}",
                f"--out={out / name}",
            ],
            out / f"{name}.console.log",
        )
        for name, arg in cells
    ]
    failed, stopped = run_side_by_side(jobs, FLAGS.side_by_side, env)
    if failed or stopped:
        print(
            f"error: {', '.join(failed) or 'no cell'} did not finish"
            + (" (stopped by a signal: the same command continues)" if stopped else "")
            + f"; consoles in {out}",
            file=sys.stderr,
        )
        sys.exit(EXIT_FAILED)
    print(report([out / name for name, _ in cells], out), flush=True)


def several_seeds():
    """One run per seed, ``--side_by_side`` processes at a time, then the table over seeds."""
    from hwh_jax.eval.report import over_seeds, seeds_length_table, seeds_table, summarize

    try:
        seeds = [int(s) for s in FLAGS.seeds]
    except ValueError:
        raise ValueError(f"--seeds must be integers, got {FLAGS.seeds}") from None
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds has a seed twice: {FLAGS.seeds}")
    if FLAGS.side_by_side < 1:
        raise ValueError(f"--side_by_side must be >= 1, got {FLAGS.side_by_side}")
    if not FLAGS.config.eval.at_end:
        raise app.UsageError("an experiment needs its closing evaluation: config.eval.at_end")
    out = storage.path(FLAGS.out)
    out.mkdir(parents=True, exist_ok=True)
    child = argv_without(sys.argv[1:], ("seeds", "side_by_side", "out"))
    env = dict(os.environ)
    if FLAGS.side_by_side > 1:  # on a GPU, each process its share of the memory
        env.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", f"{0.9 / FLAGS.side_by_side:.3f}")
    jobs = [
        (
            f"seed {s}",
            [
                sys.executable,
                "-m",
                "launch.experiment",
                *child,
                f"--config.seed={s}",
                f"--out={out / f'seed{s}'}",
            ],
            out / f"seed{s}.console.log",
        )
        for s in seeds
    ]
    failed, stopped = run_side_by_side(jobs, FLAGS.side_by_side, env)
    if failed or stopped:
        print(
            f"error: {', '.join(failed) or 'no seed'} did not finish"
            + (" (stopped by a signal: the same command continues)" if stopped else "")
            + "; consoles in "
            + str(out),
            file=sys.stderr,
        )
        sys.exit(EXIT_FAILED)
    over = {"name": out.name, **over_seeds([summarize(out / f"seed{s}") for s in seeds])}
    (out / "seeds.json").write_text(json.dumps(over, indent=2))
    print(
        f"over {len(seeds)} seeds -> {out / 'seeds.json'}\n{seeds_table([over])}\n\n"
        f"{seeds_length_table([over])}",
        flush=True,
    )


if __name__ == "__main__":
    run_main(main)
