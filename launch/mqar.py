r"""MQAR as a training task: Zoology's sweep of recall against model width.

  python -m launch.mqar --out=$OUT/mqar
  python -m launch.mqar --archs=transformer,hwh --widths=64,128 --steps=500 --out=DIR
  python -m launch.mqar --report=DIR_A,DIR_B --out=DIR   # sweeps run side by side, as one

Trains 2-layer models of each architecture and width on multi-query associative recall, every
(seed, learning rate) of one architecture and width as one vmapped program, and writes
``results.json`` (every seed's test accuracy at its best learning rate, cells with mean, sd
and pooled 95% intervals), ``table.md`` and ``mqar_sweep.png`` (accuracy against width, a panel
per sequence length). Stopped (SIGTERM, Ctrl-C, a time limit) or killed, the same command
continues: finished cells are kept and a cut cell goes on from its last saved step. The logic
is ``hwh_jax.training.mqar_sweep``.
"""
import dataclasses

from absl import app, flags

from launch import begin, one_line_errors

flags.DEFINE_string("out", None, "output folder")
flags.DEFINE_list("report", None, "sweep folders (each a --out of its own) to tabulate and plot "
                  "as one sweep into --out; nothing is trained")
flags.DEFINE_list("archs", None, "architectures (default: transformer, gdn, layerwise, hwh, "
                  "hwh_rope)")
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
flags.DEFINE_integer("save_every", 1000, "steps between saves of a cell's trials (to continue "
                     "a killed sweep: the same command into the same --out continues it)")
flags.mark_flags_as_required(["out"])
FLAGS = flags.FLAGS


def main(argv):
    del argv
    begin()
    with one_line_errors():
        run()


def run():
    from hwh_jax.training.mqar_sweep import Stopped, SweepSpec, merge, sweep, table
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
            raise ValueError(f"--settings takes SEQ_LEN:PAIRS items, got {FLAGS.settings}") \
                from None
    for name in ("steps", "batch_size", "vocab", "heads", "eval_examples", "dtype"):
        if FLAGS[name].value is not None:
            given[name] = FLAGS[name].value
    spec = SweepSpec(**given)
    print(f"MQAR sweep: {dataclasses.asdict(spec)}", flush=True)
    try:
        cells = sweep(spec, FLAGS.out, save_every=FLAGS.save_every)
    except Stopped as e:
        print(e, flush=True)
        return
    print(f"\n{table(cells)}\n\nresults, table and figure in {FLAGS.out}", flush=True)


if __name__ == "__main__":
    app.run(main)
