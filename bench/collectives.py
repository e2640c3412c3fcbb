r"""What a sharded training step sends between devices, from its compiled HLO (no accelerator).

  python bench/collectives.py --platform cpu --devices 2 --meshes 1,2,1 2,1,1 1,1,2 \
      --arch hwh --size 380m --layers 6:8 --batch 16 --seq_len 512 --vocab_size 4096

Compiles ``launch.train``'s step (``make_train_step`` under ``kernel_mesh`` with the trainer's
parameter, optimizer and batch shardings) for each mesh and lists its collectives
(``hwh_jax.profiling.hlo.collectives``): count and bytes per kind, per device and step,
and the largest ones with the jax operation each came from. ``--platform cpu`` fakes --devices
CPU devices; there the kernels are the jnp references, so the program is GSPMD's partitioning of
the model, not the GPU's kernels. ``--layers a:b`` keeps that slice of the size's layers (the
full 380m step takes minutes to compile on a CPU).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--platform", choices=("cpu", "default"), default="cpu")
    ap.add_argument("--devices", type=int, default=2, help="fake CPU devices (--platform cpu)")
    ap.add_argument("--meshes", nargs="+", default=["1,2,1", "2,1,1", "1,1,2"])
    ap.add_argument("--arch", default="hwh")
    ap.add_argument("--size", default="380m")
    ap.add_argument("--layers", default="", help="a:b, a slice of the size's layers")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq_len", type=int, default=512)
    ap.add_argument("--vocab_size", type=int, default=0)
    ap.add_argument("--top", type=int, default=5)
    ap.add_argument(
        "--override",
        nargs="*",
        default=[],
        metavar="FIELD=VALUE",
        help="ModelConfig fields, e.g. gdn.impl=chunk_reference (Python literals)",
    )
    ap.add_argument("--loss_impl", default="auto", help="train.loss_impl")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    if args.platform == "cpu":
        os.environ["JAX_PLATFORMS"] = "cpu"
        os.environ["XLA_FLAGS"] = (
            os.environ.get("XLA_FLAGS", "")
            + f" --xla_force_host_platform_device_count={args.devices}"
        )
    import jax
    import jax.numpy as jnp
    from _bench import parse_overrides

    from hwh_jax.models import model_config
    from hwh_jax.profiling import hlo
    from hwh_jax.training import sharding as shd
    from hwh_jax.training import state as train_state
    from hwh_jax.training.optimizer import OptimizerSpec, make_optimizer
    from hwh_jax.training.steps import make_train_step

    over = {
        **parse_overrides(args.override),
        **({"vocab_size": args.vocab_size} if args.vocab_size else {}),
    }
    cfg = model_config(args.arch, args.size, dtype="bfloat16", **over)
    if args.layers:
        a, b = (int(x) for x in args.layers.split(":"))
        cfg = cfg.replace(layers=cfg.layers[a:b])
    tx, schedule = make_optimizer(OptimizerSpec(lr=1e-4, warmup_steps=1, total_steps=100))
    B, T = args.batch, args.seq_len
    batch = {
        k: jax.ShapeDtypeStruct((B, T), jnp.float32 if k == "loss_mask" else jnp.int32)
        for k in ("inputs", "targets", "segment_ids", "positions", "loss_mask")
    }
    rows = []
    for dims in args.meshes:
        mesh = shd.make_mesh(tuple(int(d) for d in dims.split(",")))
        graphdef, abstract_state, state_sh = train_state.train_state_shardings(cfg, tx, mesh)
        step = train_state.jit_step(
            make_train_step(graphdef, tx, schedule, loss_impl=args.loss_impl),
            mesh,
            state_sh,
            out_shardings=(state_sh, None),
        )
        coll = hlo.collectives(step.lower(abstract_state, batch).compile().as_text())
        count, size = collections.Counter(), collections.Counter()
        for c in coll:
            count[c.op] += c.times
            size[c.op] += c.bytes * c.times
        row = {
            "mesh": dims,
            "arch": args.arch,
            "size": args.size,
            "layers": args.layers,
            "override": args.override,
            "loss_impl": args.loss_impl,
            "batch": B,
            "seq_len": T,
            "backend": jax.default_backend(),
            "count": dict(count),
            "mib": {k: v / 2**20 for k, v in size.items()},
            "total_mib": sum(size.values()) / 2**20,
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
        for c in sorted(coll, key=lambda c: -c.bytes)[: args.top]:
            print(
                f"    {c.bytes / 2**20:8.1f} MiB  {c.op:15s} {str(c.shapes)[:48]:48s} "
                f"{c.source[-70:]}"
            )
    print(
        f"\n{'mesh':>8} "
        + " ".join(
            f"{k:>20}"
            for k in (
                "all-gather",
                "all-reduce",
                "reduce-scatter",
                "all-to-all",
                "collective-permute",
            )
        )
        + f" {'total MiB':>10}"
    )
    for r in rows:
        cells = [
            f"{r['count'].get(k, 0):4d} / {r['mib'].get(k, 0.0):9.1f} MiB"
            for k in (
                "all-gather",
                "all-reduce",
                "reduce-scatter",
                "all-to-all",
                "collective-permute",
            )
        ]
        print(f"{r['mesh']:>8} " + " ".join(f"{c:>20}" for c in cells) + f" {r['total_mib']:10.1f}")
    if args.out:
        with open(args.out, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)


if __name__ == "__main__":
    sys.exit(main())
