r"""The training loader's throughput from prepared token shards, per process.

  python bench/data_loader.py --shards /data/fwe_gpt2 --seq_len 2048 --global_batch 256 \
      --process_count 4 --workers 0 2 --seconds 20

Builds what ``launch.train`` builds from a ``data.source=shards`` folder (packed windows of
``seq_len + 1`` tokens, globally shuffled, this process's share of each global batch, in
``--workers`` Grain worker processes) and times batches for ``--seconds`` after the first:
tokens/s this process delivers, against a step's need printed beside it. Reports the process'
peak resident memory (``ru_maxrss``) too.
"""

from __future__ import annotations

import argparse
import json
import resource
import time


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shards", required=True, help="a folder launch.prepare_data wrote")
    p.add_argument("--seq_len", type=int, default=2048)
    p.add_argument("--global_batch", type=int, default=256)
    p.add_argument(
        "--process_count",
        type=int,
        default=1,
        help="hosts sharing the global batch (this process reads 1/process_count)",
    )
    p.add_argument("--workers", type=int, nargs="*", default=[0, 2])
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--out", default="")
    args = p.parse_args()
    from absl import flags

    flags.FLAGS.mark_as_parsed()  # Grain's worker processes read absl flags
    from hwh_jax.data import shards
    from hwh_jax.data.packing import PackedSequences
    from hwh_jax.data.pipeline import train_dataset

    stream = shards.TokenStream(args.shards)
    eos = stream.manifest["tokenizer"]["eos_id"]
    seqs = PackedSequences(stream, args.seq_len, eos_id=eos, pad_id=eos)
    rows = []
    for w in args.workers:
        it = iter(
            train_dataset(
                seqs,
                global_batch=args.global_batch,
                seed=0,
                process_index=0,
                process_count=args.process_count,
                workers=w,
            )
        )
        first = next(it)
        per_batch = first["inputs"].size
        t0, n = time.perf_counter(), 0
        while time.perf_counter() - t0 < args.seconds:
            next(it)
            n += 1
        dt = time.perf_counter() - t0
        row = {
            "shards": args.shards,
            "stream_tokens": len(stream),
            "seq_len": args.seq_len,
            "batch_this_process": first["inputs"].shape[0],
            "workers": w,
            "batches": n,
            "tokens_per_s": round(n * per_batch / dt),
            "max_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
        del it
    if args.out:
        with open(args.out, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)


if __name__ == "__main__":
    main()
