r"""Lower a run's programs for a platform this host need not have, and say what they hold.

  python -m launch.export --config=configs/hwh_1b4.py --platform=tpu --devices=16 \
      --config.train.mesh=4,4,1 --out=/tmp/hwh_1b4_tpu
  python -m launch.export --config=configs/base.py:hwh_380m --platform=gpu --devices=8 \
      --config.train.mesh=1,8,1 --inference --context=32768

Writes ``OUT/train_step.mlir`` (the StableHLO module ``launch.train`` would run on that mesh)
and ``OUT/summary.json`` (module size, custom calls, the Pallas kernels by name, input
shardings; with ``--inference`` the prefill and decode steps too) and prints the summary.
``--devices=N`` fakes N CPU devices for the mesh (the program's shardings do not depend on the
kind of device). The logic is ``hwh_jax.training.export``; docs/tpu.md shows its output.
"""

import json
import os

from absl import flags
from ml_collections import config_flags

from hwh_jax import storage
from launch import one_line_errors, run_main, setup_logging

config_flags.DEFINE_config_file("config", None, "run config file", lock_config=True)
flags.DEFINE_enum("platform", "tpu", ["tpu", "gpu", "cpu"], "platform to lower for")
flags.DEFINE_integer("devices", 0, "fake this many CPU devices for the mesh (0: the host's)")
flags.DEFINE_bool("inference", False, "also lower the prefill and one decode step")
flags.DEFINE_integer("batch", 1, "inference batch")
flags.DEFINE_integer("context", 8192, "inference cache length")
flags.DEFINE_string("out", "", "folder for the module and summary.json")
flags.mark_flags_as_required(["config"])
FLAGS = flags.FLAGS


def main(argv):
    del argv
    if FLAGS.devices:  # read when JAX first starts a backend, which has not happened yet
        os.environ["JAX_PLATFORMS"] = "cpu"
        os.environ["XLA_FLAGS"] = (
            os.environ.get("XLA_FLAGS", "")
            + f" --xla_force_host_platform_device_count={FLAGS.devices}"
        )
    setup_logging()
    with one_line_errors():
        export()


def export():
    import jax

    from hwh_jax.training import export as lib

    config = FLAGS.config
    devices = jax.devices()
    exported = lib.export_train_step(
        config, platform=FLAGS.platform, mesh=tuple(config.train.mesh), devices=devices
    )
    summary = {
        "config": FLAGS["config"].config_filename,
        "platform": FLAGS.platform,
        "mesh": list(config.train.mesh),
        "train_step": lib.summarize(exported),
    }
    out = storage.path(FLAGS.out) if FLAGS.out else None
    if out:
        out.mkdir(parents=True, exist_ok=True)
        (out / "train_step.mlir").write_text(exported.mlir_module())
    if FLAGS.inference:
        cfg = lib.run_model_config(config, FLAGS.platform)
        for name, e in lib.export_inference_steps(
            cfg, platform=FLAGS.platform, batch=FLAGS.batch, context=FLAGS.context
        ).items():
            summary[name] = lib.summarize(e)
            if out:
                (out / f"{name}.mlir").write_text(e.mlir_module())
    text = json.dumps(summary, indent=2)
    if out:
        (out / "summary.json").write_text(text)
    print(text, flush=True)


if __name__ == "__main__":
    run_main(main)
