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

from _bench import emit, print_device

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
    print_device()
    rows = []
    for arch in args.archs:
        for step, loss, sec in train_copy(
            arch, args.size, steps=args.steps, length=args.length, batch=args.batch, lr=args.lr
        ):
            row = {"arch": arch, "size": args.size, "step": step, "copy_loss": loss, "seconds": sec}
            emit(rows, row)
            if args.out:  # appended: runs of several archs in parallel share one file
                with open(args.out, "a") as f:
                    f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
