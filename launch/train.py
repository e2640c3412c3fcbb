r"""Pretrain a model: ``python -m launch.train --config=configs/hwh_tiny.py --workdir=runs/x``.

Intentionally short: the logic is ``hwh_jax.training.trainer.train_and_evaluate``. Any config
field can be overridden, e.g. ``--config.train.steps=100 --config.train.mesh=1,2,4``. On a
multi-host TPU slice or GPU cluster every process runs this same command (``launch.devices``:
the device defaults set and how several processes find each other). Exit statuses and the
log file (``<workdir>/train.log``): ``launch/__init__.py``.
"""

import os
import sys

from absl import flags
from ml_collections import config_flags

from hwh_jax import storage
from launch import begin, one_line_errors, run_main

config_flags.DEFINE_config_file("config", None, "run config file", lock_config=True)
flags.DEFINE_string("workdir", None, "checkpoints, metrics and plots go here")
flags.mark_flags_as_required(["config", "workdir"])
FLAGS = flags.FLAGS


def main(argv):
    del argv
    with one_line_errors():  # a bad setting, a bucket URL without its package, a folder
        from hwh_jax.training.specs import run_specs  # that cannot be written: one line,

        run_specs(FLAGS.config)  # nothing written (no workdir, no log file)
        storage.check_backend(FLAGS.workdir)
        storage.check_reachable(FLAGS.workdir)
        storage.make_folder(FLAGS.workdir)
    # the first process logs to train.log, process i to train.i.log
    begin(lambda i: os.path.join(FLAGS.workdir, f"train.{i}.log" if i else "train.log"))
    with one_line_errors():
        from hwh_jax.training.trainer import train_and_evaluate

        result = train_and_evaluate(FLAGS.config, FLAGS.workdir)
    if result.signalled and FLAGS.config.train.stop_exit_status:
        sys.exit(FLAGS.config.train.stop_exit_status)


if __name__ == "__main__":
    run_main(main)
