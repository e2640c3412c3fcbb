r"""Why a held-out loss scored over the first rows of the held-out stream depends on how many
rows are scored: one trained run's loss over its first K sequences, in stream order, for
several K, against the seeded sample every run now scores (``pipeline.eval_order``).

  python bench/heldout_order.py --checkpoint=RUN --counts=220,260,320,640,0 --sample=320

The stream is the held-out text in the order of its files (books one after another), so the
first rows are one book; an evaluation of "at most N batches of the micro-batch" (the earlier
``train.eval_batches``) scored 20 x micro-batch rows, more text (and more books) for a larger
micro-batch. Each row: K (0 = all), the loss over those rows, the tokens, and the loss of each
block of --block rows along the stream (how the books differ).
"""

from __future__ import annotations

import argparse
import json

import jax
import numpy as np
from _bench import emit, write_jsonl
from flax import nnx

from hwh_jax.data.packing import PackedSequences
from hwh_jax.data.pipeline import eval_order
from hwh_jax.training.restore import load_run
from hwh_jax.training.steps import make_eval_step


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--counts", default="220,260,320,640,0")
    ap.add_argument("--sample", type=int, default=320)
    ap.add_argument("--block", type=int, default=64)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    run = load_run(args.checkpoint)
    L = int(run.config.seq_len)
    tok = run.tokenizer
    seqs = PackedSequences(run.heldout_stream(), L, eos_id=tok.eos_id, pad_id=tok.pad_id)
    graphdef, params = nnx.split(run.model, nnx.Param)
    step = jax.jit(make_eval_step(graphdef, document_mask=bool(run.config.train.document_mask)))
    sums, counts = np.zeros(len(seqs)), np.zeros(len(seqs))
    for i in range(len(seqs)):  # every row's summed nll, once (one row a call: per-row sums)
        total, n = step(params, {k: v[None] for k, v in seqs[i].items() if k != "index"})
        sums[i], counts[i] = float(total), float(n)
    rows = []
    for k in [int(c) for c in args.counts.split(",")]:
        k = k or len(seqs)
        emit(
            rows,
            {
                "rows": "first",
                "count": k,
                "loss": sums[:k].sum() / counts[:k].sum(),
                "tokens": counts[:k].sum(),
            },
        )
    pick = eval_order(len(seqs), args.sample)
    emit(
        rows,
        {
            "rows": "sample",
            "count": len(pick),
            "loss": sums[pick].sum() / counts[pick].sum(),
            "tokens": counts[pick].sum(),
        },
    )
    blocks = [
        sums[b : b + args.block].sum() / max(counts[b : b + args.block].sum(), 1)
        for b in range(0, len(seqs), args.block)
    ]
    emit(rows, {"rows": "blocks", "block": args.block, "losses": [round(x, 4) for x in blocks]})
    write_jsonl(args.out, rows)
    print(json.dumps({"run": str(run.workdir), "step": run.step, "heldout_rows": len(seqs)}))


if __name__ == "__main__":
    main()
