r"""Can an architecture learn to copy? The simplest form of retrieval, for the models of
docs/results.md (the task: ``hwh_jax/eval/copy_task.py``).

  python bench/copy_task.py --archs transformer hwh gdn --size tiny --steps 300

Adam at --lr, --batch sequences of a --length-token string and its copy per step, fp32, on the
default device; prints the copy loss every 100 steps (chance: ln 62 = 4.13 nats) as JSON lines,
also appended to --out.
"""
from __future__ import annotations

import argparse
import json

import jax

import hwh_jax  # noqa: F401  (flax settings)
from hwh_jax.eval.copy_task import train_copy


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--archs", nargs="+", default=["transformer", "hwh", "gdn"])
    ap.add_argument("--size", default="tiny")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--length", type=int, default=24)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    print(json.dumps({"device": jax.devices()[0].device_kind, "jax": jax.__version__}))
    for arch in args.archs:
        rows = train_copy(arch, args.size, steps=args.steps, length=args.length,
                          batch=args.batch, lr=args.lr)
        for step, loss, sec in rows:
            row = {"arch": arch, "size": args.size, "step": step, "copy_loss": loss,
                   "seconds": sec}
            print(json.dumps(row), flush=True)
            if args.out:
                with open(args.out, "a") as f:
                    f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
