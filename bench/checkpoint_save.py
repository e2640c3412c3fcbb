"""What a checkpoint save costs the training loop, asynchronous against synchronous.

  python bench/checkpoint_save.py --size=tiny --steps=40 --every=10 --out=rows.jsonl
  python bench/checkpoint_save.py --size=small --steps=12 --every=4 --batch=2 --seq_len=128

Trains the same run three times in this process (``train_and_evaluate``, the trainer's own
loop): without any save, with synchronous saves and with asynchronous ones (a save every
``--every`` steps, the last step's included). Per mode it reports the loop's wall time
(the steps, the saves' blocking part, and at the end the wait for the last save to be
committed) and the time each ``save`` held the loop; the cost of a save is the loop's time
over the run without saves, divided by the saves (it includes, for asynchronous saves, what
the background writing takes from the steps it overlaps). Rows: one JSON line per mode.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from _bench import emit, print_device, write_jsonl

from configs import base
from hwh_jax.data.paths import resolve
from hwh_jax.training import checkpoint as ckpt_lib
from hwh_jax.training import loop as loop_lib
from hwh_jax.training import trainer


def config_for(args, every: int, asynchronous: bool):
    config = base.get_config(f"hwh_{args.size}")
    if args.seq_len:
        config.seq_len = args.seq_len
    config.data.paths = (str(resolve(args.corpus)),)
    t = config.train
    t.steps, t.batch_size, t.warmup_steps = args.steps, args.batch, 2
    t.log_every, t.eval_every, t.final_eval = args.steps, 0, False
    t.checkpoint_every, t.async_checkpoints = every, asynchronous
    t.mesh, t.loggers = (1, 1, 1), ""
    config.eval.at_end = False
    return config


def measure(args, mode: str) -> dict:
    every = 0 if mode == "none" else args.every
    held = []
    real_save, real_train = ckpt_lib.Checkpointer.save, loop_lib.Loop.run

    def timed_save(self, *a, **kw):
        t = time.perf_counter()
        out = real_save(self, *a, **kw)
        if out:  # False: that step's checkpoint existed already
            held.append(time.perf_counter() - t)
        return out

    loop = {}

    def timed_train(self):
        t = time.perf_counter()
        out = real_train(self)
        self.checkpointer.wait()  # the last save committed: part of the loop's cost
        loop["s"] = time.perf_counter() - t
        return out

    ckpt_lib.Checkpointer.save, loop_lib.Loop.run = timed_save, timed_train
    real_run_save = loop_lib.Loop.save
    if mode == "none":  # the steps alone: not even the final save
        loop_lib.Loop.save = lambda self, step: None
    try:
        with tempfile.TemporaryDirectory() as workdir:
            result = trainer.train_and_evaluate(config_for(args, every, mode == "async"), workdir)
            size = sum(
                f.stat().st_size for f in Path(workdir, "checkpoints").rglob("*") if f.is_file()
            )
    finally:
        ckpt_lib.Checkpointer.save, loop_lib.Loop.run = real_save, real_train
        loop_lib.Loop.save = real_run_save
    return {
        "size": args.size,
        "mode": mode,
        "steps": args.steps,
        "every": every,
        "saves": len(held),
        "loop_s": round(loop["s"], 3),
        "save_held_s": [round(h, 3) for h in held],
        "checkpoint_bytes_on_disk": size,
        "params": result.summary["params"],
        "final_loss": result.losses[max(result.losses)],
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="tiny", choices=["tiny", "small", "380m", "1b4"])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--every", type=int, default=10)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq_len", type=int, default=0, help="0: the size's own")
    p.add_argument("--corpus", default="dickens/dickens.zip")
    p.add_argument("--out", default="")
    args = p.parse_args()
    print_device()
    rows = []
    for mode in ("none", "sync", "async"):
        emit(rows, measure(args, mode))
    base_s = rows[0]["loop_s"]
    for row in rows[1:]:
        cost = (row["loop_s"] - base_s) / max(row["saves"], 1)
        emit(
            rows,
            {
                "size": args.size,
                "mode": row["mode"],
                "cost_per_save_s": round(cost, 3),
                "mean_save_held_s": round(sum(row["save_held_s"]) / row["saves"], 3),
            },
        )
    write_jsonl(args.out, rows)
    print(json.dumps({"summary": {r["mode"]: r.get("cost_per_save_s") for r in rows[3:]}}))


if __name__ == "__main__":
    main()
