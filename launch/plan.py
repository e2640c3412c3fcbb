r"""Size a training run for a TPU slice on any host: compile its step with the TPU compiler.

  python -m launch.plan --config=configs/hwh_1b4.py --topology=v5p-32 --config.train.mesh=4,4,1
  python -m launch.plan --config=configs/hwh_tiny.py --topology=v5e:2x2 --out=/tmp/plan

``--topology``: a Cloud TPU name (``v5p-32``, ``v5e-16``, ``v6e-256``, ``v4-8``) or a chip grid
(``v5p:2x2x4``, ``v5e:4x4``). Needs the TPU compiler: ``pip install -e ".[tpu-plan]"``. Prints
the plan (memory per chip against the chip's HBM, the micro-batch the planner chooses, FLOPs and
bytes from the compiler, collectives, Mosaic kernels, an estimated step time and MFU) and writes
it to ``OUT/plan.json`` with ``--out``. A config that does not fit exits 3 with the memory it
needs and what would make it fit. The logic is ``hwh_jax.training.pod_plan``; docs/tpu.md
explains the estimate.
"""

import gzip
import json
import logging
import os
import sys

from absl import flags
from ml_collections import config_flags

from hwh_jax import storage
from launch import devices, one_line_errors, run_main, setup_logging

config_flags.DEFINE_config_file("config", None, "run config file", lock_config=True)
flags.DEFINE_string("topology", None, "a TPU slice: v5p-32, v5e-16, v6e-256, v5p:2x2x4, ...")
flags.DEFINE_string("out", "", "folder for plan.json")
flags.DEFINE_bool("inference", False, "also the prefill and one decode step, on one chip")
flags.DEFINE_integer("batch", 1, "inference batch")
flags.DEFINE_integer("context", 8192, "inference cache length (the prompt: half of it)")
flags.DEFINE_list(
    "serve_mesh",
    [],
    "inference over the slice: data,fsdp,tensor (requests over "
    "data x fsdp, weights over fsdp and tensor); default one chip",
)
flags.DEFINE_bool(
    "hlo",
    False,
    "also write the compiled train step's HLO text to "
    "OUT/train_step.hlo.txt.gz (collectives, fusions, layouts)",
)
flags.mark_flags_as_required(["config", "topology"])
FLAGS = flags.FLAGS
EXIT_DOES_NOT_FIT = 3


def main(argv):
    del argv
    # compile-only TPU devices: JAX itself stays on the CPU, and libtpu is told it runs on no
    # TPU VM (so it does not probe the instance's metadata)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # compiling only: no TPU to own
    made = devices.apply_defaults(on="tpu")  # the compiler flags launch.train sets on a TPU
    setup_logging()
    for line in made:
        logging.info("%s", line)
    with one_line_errors():
        plan()


def plan():
    from hwh_jax.training import memory, pod_plan, tpu_slices

    slice_ = tpu_slices.parse(FLAGS.topology)
    tpu_slices.check_libtpu()
    print(
        f"compiling {FLAGS['config'].config_filename} for {slice_.name} "
        f"({slice_.chips} chips of {slice_.chip.generation}, grid {slice_.topology_name}) "
        f"with the TPU compiler; a 1.4B model takes minutes",
        flush=True,
    )
    try:
        result = pod_plan.plan_train(FLAGS.config, slice_, keep_hlo=FLAGS.hlo)
    except memory.MemoryPlanError as e:
        print(f"does not fit: {e}", file=sys.stderr, flush=True)
        _write(
            {
                "topology": slice_.name,
                "fits": False,
                "arch": FLAGS.config.model.arch,
                "seq_len": FLAGS.config.seq_len,
                "mesh": list(FLAGS.config.train.mesh),
                "error": str(e),
            }
        )
        sys.exit(EXIT_DOES_NOT_FIT)
    except Exception as e:  # the TPU compiler's refusals have no type of their own
        text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if "XLA:TPU compile" not in text and "RESOURCE_EXHAUSTED" not in text:
            raise
        logging.debug("the TPU compiler refused the step", exc_info=True)
        print(
            f"does not compile: the TPU compiler refused the step for {slice_.name}: {text}",
            file=sys.stderr,
            flush=True,
        )
        _write(
            {
                "topology": slice_.name,
                "fits": False,
                "arch": FLAGS.config.model.arch,
                "seq_len": FLAGS.config.seq_len,
                "mesh": list(FLAGS.config.train.mesh),
                "error": f"the TPU compiler refused the step: {text}",
            }
        )
        sys.exit(EXIT_DOES_NOT_FIT)
    if FLAGS.inference:
        result["inference"] = pod_plan.plan_inference(
            FLAGS.config,
            slice_,
            batch=FLAGS.batch,
            context=FLAGS.context,
            serve_mesh=tuple(int(d) for d in FLAGS.serve_mesh) or None,
        )
    hlo_text = result.pop("hlo", None)
    _write(result)
    if hlo_text is not None and FLAGS.out:
        with (storage.path(FLAGS.out) / "train_step.hlo.txt.gz").open("wb") as f:
            f.write(gzip.compress(hlo_text.encode()))
    print(format_plan(result), flush=True)


def _write(result: dict):
    if FLAGS.out:
        out = storage.path(FLAGS.out)
        out.mkdir(parents=True, exist_ok=True)
        storage.write_text(out / "plan.json", json.dumps(result, indent=2))


def format_plan(r: dict) -> str:
    gib = 2**30
    m, p, e = r["memory"], r["plan"], r["estimate"]
    lines = [
        f"{r['arch']} at {r['seq_len']} tokens, batch {r['batch_size']}, on {r['topology']} "
        f"({r['chips']} chips), mesh {r['mesh']}",
        f"memory per chip: {m['step_bytes'] / gib:.2f} GiB of {m['hbm'] / gib:.0f} GiB "
        f"(arguments {m['arguments'] / gib:.2f}, outputs {m['outputs'] / gib:.2f}, aliased "
        f"{m['aliased'] / gib:.2f}, temporaries {m['temporaries'] / gib:.2f}, code "
        f"{m['code'] / gib:.2f})",
        f"micro-batch {p['micro_batch']} x {p['grad_accum']} accumulated "
        f"(probed: {', '.join(f'{a}: {b / gib:.2f} GiB' for a, b in p['probes']) or '-'})",
        f"compiler: {r['cost']['flops'] / 1e12:.2f} TFLOP and "
        f"{r['cost']['bytes_accessed'] / gib:.2f} GiB accessed per chip (loop bodies once)",
        "collectives per step and chip: "
        + (
            ", ".join(
                f"{k} {v['count']} x, {v['bytes'] / gib:.3f} GiB ({v['wire_bytes'] / gib:.3f} sent)"
                for k, v in sorted(r["collectives"].items())
            )
            or "none"
        ),
        *(
            [f"compiled with {r['compiler_options']} (the launcher's flags refused it)"]
            if r.get("compiler_options")
            else []
        ),
        f"Mosaic kernels: {sum(r['kernels'].values())} "
        f"({', '.join(f'{k} {v}' for k, v in r['kernels'].items()) or 'none'})",
        f"estimated step: {e['step_s_overlapped'] * 1e3:.1f} ms if all overlaps, "
        f"{e['step_s_serial'] * 1e3:.1f} ms if nothing does (compute {e['compute_s'] * 1e3:.1f}, "
        f"HBM {e['hbm_s'] * 1e3:.1f}, ICI {e['ici_s'] * 1e3:.1f} ms); "
        f"{e['tokens_per_s_serial'] / 1e3:,.0f}k-{e['tokens_per_s_overlapped'] / 1e3:,.0f}k "
        f"tokens/s, MFU {100 * e['mfu_serial']:.0f}-{100 * e['mfu_overlapped']:.0f}%",
    ]
    load = r.get("causal_load", {})
    if load.get("shards", 1) > 1:
        share = (
            f"sequence axis of {load['shards']}: global causal attention is "
            f"{100 * load['attention_share']:.1f}% of the FLOPs; "
        )
        if load.get("balanced"):
            lines.append(share + "each device holds an early and a late chunk of the queries "
                         "(model.attention.balance): every one computes the mean")  # fmt: skip
        else:
            lines.append(
                share + f"the last shard computes {load['last_shard_attention']:.2f}x the mean "
                f"attention, {load['last_shard_compute']:.3f}x the mean compute (the step waits "
                "on it)"
            )
    inf = r.get("inference", {})
    where = f"mesh {inf['mesh']}" if inf.get("mesh") else "one chip"
    for name in ("prefill", "decode"):
        if name in inf:
            s = inf[name]
            sent = sum(v["wire_bytes"] for v in s["collectives"].values())
            lines.append(
                f"{name} (batch {inf['batch']}, cache {inf['context']}, {where}): "
                f"{s['memory']['step_bytes'] / gib:.2f} GiB of a chip's "
                f"{s['memory']['hbm'] / gib:.0f}, Mosaic kernels "
                f"{sum(s['kernels'].values())}, collectives {sent / 2**20:.1f} MiB "
                f"sent a chip"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    run_main(main)
