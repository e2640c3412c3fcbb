r"""MQAR as a training task: Zoology's sweep of recall against model width.

  python -m launch.mqar --out=$OUT/mqar
  python -m launch.mqar --archs=transformer,hwh --widths=64,128 --steps=500 --out=DIR
  python -m launch.mqar --side_by_side=8 --out=$OUT/mqar   # 8 cells at once, one process each
  python -m launch.mqar --report=DIR_A,DIR_B --out=DIR   # sweeps run apart, as one

Trains 2-layer models of each architecture and width on multi-query associative recall, every
(seed, learning rate) of one architecture and width as one vmapped program, and writes
``results.json`` (every seed's test accuracy at its best learning rate, cells with mean, sd
and pooled 95% intervals), ``table.md`` and ``mqar_sweep.png`` (accuracy against width, a panel
per sequence length). Stopped (SIGTERM, Ctrl-C, a time limit) or killed, the same command
continues: finished cells are kept and a cut cell goes on from its last saved step. With
--side_by_side=N every (architecture, width) cell is a process of its own into
``OUT/cells/ARCH_WIDTH`` (console ``OUT/cells/ARCH_WIDTH.console.log``), N at a time (small
models share one GPU; no memory preallocation unless XLA_PYTHON_CLIENT_PREALLOCATE is set), and
the finished cells are merged into --out; a signal to the command reaches every cell. The logic
is ``hwh_jax.experiments.mqar``.
"""

import dataclasses
import os
import sys

from absl import flags

from hwh_jax import storage
from hwh_jax.experiments.processes import argv_without, run_side_by_side
from launch import EXIT_FAILED, begin, one_line_errors, run_main

flags.DEFINE_string("out", None, "output folder")
flags.DEFINE_list(
    "report",
    None,
    "sweep folders (each a --out of its own) to tabulate and plot "
    "as one sweep into --out; nothing is trained",
)
flags.DEFINE_list(
    "archs", None, "architectures (default: transformer, gdn, layerwise, hwh, hwh_rope)"
)
flags.DEFINE_list("widths", None, "model widths (default 64,128,256,512)")
flags.DEFINE_list("settings", None, "SEQ_LEN:PAIRS settings (default 64:4,128:8,256:16,512:64)")
flags.DEFINE_list("lrs", None, "peak learning rates tried per seed (default 1e-3,3e-3,1e-2)")
flags.DEFINE_list("seeds", None, "initialisation seeds (default 0,1,2)")
flags.DEFINE_integer("steps", None, "training steps (default 6000)")
flags.DEFINE_integer("batch_size", None, "sequences a step, settings mixed (default 64)")
flags.DEFINE_integer("vocab", None, "vocabulary (default 8192)")
flags.DEFINE_integer("heads", None, "heads a layer (default 4)")
flags.DEFINE_integer("eval_examples", None, "validation and test sequences per setting (256)")
flags.DEFINE_string("dtype", None, "compute dtype (default bfloat16)")
flags.DEFINE_enum(
    "mode",
    "mixed",
    ["mixed", "zoology"],
    "mixed: every setting in one model (the defaults above); zoology: Zoology's Figure 2, a "
    "model per setting on a fixed training set (hwh_jax.experiments.mqar.spec.zoology_spec; "
    "the other flags override its values)",
)
flags.DEFINE_integer("train_examples", None, "zoology: training examples a setting (100000)")
flags.DEFINE_integer("epochs", None, "zoology: passes over them (64)")
flags.DEFINE_integer(
    "save_every",
    1000,
    "steps between saves of a cell's trials (to continue "
    "a killed sweep: the same command into the same --out continues it)",
)
flags.DEFINE_integer(
    "side_by_side",
    1,
    "cells trained at once, each (architecture, width) a "
    "process of its own into OUT/cells, merged into --out at the end (1: the "
    "cells in turn in this process)",
)
flags.mark_flags_as_required(["out"])
FLAGS = flags.FLAGS


def main(argv):
    del argv
    begin()
    with one_line_errors():
        run()


def run():
    from hwh_jax.experiments.mqar.report import table
    from hwh_jax.experiments.mqar.spec import SweepSpec, zoology_spec
    from hwh_jax.experiments.mqar.sweep import merge, sweep
    from hwh_jax.experiments.mqar.train import Stopped

    if FLAGS.report:
        cells = merge(FLAGS.report, FLAGS.out)
        print(f"{table(cells)}\n\nresults, table and figure in {FLAGS.out}", flush=True)
        return
    given = {}
    for name, cast in (("archs", str), ("widths", int), ("lrs", float), ("seeds", int)):
        if FLAGS[name].value is not None:
            given[name] = tuple(cast(v) for v in FLAGS[name].value)
    if FLAGS.settings is not None:
        try:
            given["settings"] = tuple(tuple(int(x) for x in s.split(":")) for s in FLAGS.settings)
        except ValueError:
            raise ValueError(
                f"--settings takes SEQ_LEN:PAIRS items, got {FLAGS.settings}"
            ) from None
    for name in (
        "steps",
        "batch_size",
        "vocab",
        "heads",
        "eval_examples",
        "dtype",
        "train_examples",
        "epochs",
    ):
        if FLAGS[name].value is not None:
            given[name] = FLAGS[name].value
    spec = zoology_spec(**given) if FLAGS.mode == "zoology" else SweepSpec(**given)
    print(f"MQAR sweep: {dataclasses.asdict(spec)}", flush=True)
    if FLAGS.side_by_side != 1:
        cells_side_by_side(spec)
        return
    try:
        cells = sweep(spec, FLAGS.out, save_every=FLAGS.save_every)
    except Stopped as e:
        print(e, flush=True)
        return
    print(f"\n{table(cells)}\n\nresults, table and figure in {FLAGS.out}", flush=True)


def cells_side_by_side(spec):
    """Each (architecture, width) cell its own ``launch.mqar`` process, ``--side_by_side`` at a
    time, then the finished cells merged into --out (module docstring)."""
    from hwh_jax.experiments.mqar.report import table
    from hwh_jax.experiments.mqar.sweep import merge

    spec.validate()
    out = storage.path(FLAGS.out)
    cells = out / "cells"
    child = argv_without(sys.argv[1:], ("archs", "widths", "out", "side_by_side"))
    env = dict(os.environ)
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # cells differ in memory
    names = [(a, w) for a in spec.archs for w in spec.widths]
    jobs = [
        (
            f"{a} d={w}",
            [
                sys.executable,
                "-m",
                "launch.mqar",
                *child,
                f"--archs={a}",
                f"--widths={w}",
                f"--out={cells / f'{a}_{w}'}",
            ],
            cells / f"{a}_{w}.console.log",
        )
        for a, w in names
    ]
    failed, stopped = run_side_by_side(jobs, FLAGS.side_by_side, env)
    done = [cells / f"{a}_{w}" for a, w in names if (cells / f"{a}_{w}" / "results.json").exists()]
    if done:
        print(
            f"\n{table(merge(done, out))}\n\n{len(done)} of {len(names)} cells; results, "
            f"table and figure in {out}",
            flush=True,
        )
    if len(done) < len(names):
        print(
            f"error: {len(names) - len(done)} cells did not finish"
            + (f" ({', '.join(failed)} failed)" if failed and not stopped else "")
            + (" (stopped by a signal)" if stopped else "")
            + f"; the same command continues them; consoles in {cells}",
            file=sys.stderr,
        )
        sys.exit(EXIT_FAILED)


if __name__ == "__main__":
    run_main(main)
