r"""What causal attention over a sequence mesh axis costs each device on cuDNN, and its accuracy,
on one GPU.

  python bench/attention_rows.py --out attention_rows.jsonl

Over a sequence axis of n devices each device keeps its T / n queries and gathers the keys and
values. cuDNN runs that device's rows as blocks merged by log-sum-exp
(``kernels_pallas.attention.shard_rows``); without them each device computed every query of
the gathered sequence (JAX's cuDNN mask has no query offset). This script times, on one GPU,
the forward+backward of the last shard's rows (every device runs the last one's blocks)
against cuDNN over the whole sequence (what every device computed before), the all-gather not
included (the same in both), with and without documents and a sliding window; and checks every
shard's rows, stacked, against the fp32 reference over the whole sequence, beside cuDNN over
the whole sequence (bf16 inputs). ``work`` is the last shard's (query, key) pairs over the
whole sequence's. Causal without a window, the devices may instead swap half their queries
so that each holds an early and a late chunk (``kernels_pallas.attention.zigzag``, the
default): ``zigzag_fwd_bwd_ms`` times a device's ``zigzag_rows`` (the same shapes and pairs on
every device), ``zigzag_work`` its pairs over the whole sequence's, and the accuracy rows
check every device's swapped rows the same way. Heads: B = 1, 4 query and kv heads of 128
(HwH-1.4B's layers have 0-5 full-attention heads); the accuracy rows B = 2, 8 query heads
over 2 kv heads.
"""

from __future__ import annotations

import argparse
import functools

import _bench
import jax
import jax.numpy as jnp
import numpy as np
from _bench import attention_inputs, forward_backward, median_ms, rel_err

from kernels_pallas.attention import AttentionSettings, attention, attention_reference, zigzag
from kernels_pallas.attention import shard_rows as rows_mod

CUDNN = AttentionSettings(impl="cudnn")
BLOCKS = rows_mod.CUDNN


def _whole(attn):
    """(q, k, v, dO, seg) -> attention over the whole sequence and its gradients (the segment
    ids an argument, not a constant XLA would fold into a [T, T] mask at compile time)."""

    def f(q, k, v, do, seg):
        return forward_backward(lambda q, k, v: attn(q, k, v, segment_ids=seg))(q, k, v, do)

    return f


def _rows_step(shards, L, window):
    """(q_rows, k, v, dO_rows, seg, index) -> shard ``index``'s rows on cuDNN's blocks and
    their gradients."""

    def f(q_rows, k, v, do_rows, seg, index):
        fn = lambda q_rows, k, v: _rows(q_rows, k, v, seg, index, shards, L, window)
        return forward_backward(fn)(q_rows, k, v, do_rows)

    return f


def _rows(q_rows, k, v, seg, index, shards, L, window):
    q_seg = None if seg is None else jax.lax.dynamic_slice_in_dim(seg, index * L, L, 1)
    return rows_mod.shard_rows(
        q_rows, k, v, index, shards=shards, window=window, segment_ids=q_seg,
        kv_segment_ids=seg, blocks=BLOCKS,
    )  # fmt: skip


def _zigzag_step(shards):
    """(q_rows, k, v, dO_rows, seg, index) -> device ``index``'s swapped rows (its chunks a and
    b, ``zigzag.chunks``) on cuDNN's blocks and their gradients."""

    def f(q_rows, k, v, do_rows, seg, index):
        q_seg = None if seg is None else zigzag.rows(seg, index, shards)
        fn = lambda q_rows, k, v: zigzag.zigzag_rows(
            q_rows, k, v, index, shards=shards, segment_ids=q_seg,
            kv_segment_ids=seg, blocks=BLOCKS,
        )  # fmt: skip
        return forward_backward(fn)(q_rows, k, v, do_rows)

    return f


def _pairs(start, stop, window):
    """Causal (query, key) pairs of queries [start, stop), within the window if any."""
    t = np.arange(start, stop)
    return int(np.sum(t + 1 if window is None else np.minimum(t + 1, window)))


def accuracy(T, shards, documents, window):
    B, H, G, D = 2, 8, 2, 128
    L = T // shards
    q, k, v, do, seg = attention_inputs(B, T, H, G, D, documents)
    reference = functools.partial(attention_reference, window=window)
    want = jax.jit(_whole(reference))(*[x.astype(jnp.float32) for x in (q, k, v, do)], seg)
    cudnn = functools.partial(attention, window=window, settings=CUDNN)
    plain = jax.jit(_whole(cudnn))(q, k, v, do, seg)
    step = jax.jit(_rows_step(shards, L, window))
    o, dq, dk, dv = [], [], 0.0, 0.0
    for i in range(shards):
        sl = slice(i * L, (i + 1) * L)
        out = step(q[:, sl], k, v, do[:, sl], seg, jnp.int32(i))
        o.append(out[0])
        dq.append(out[1])
        dk, dv = dk + out[2].astype(jnp.float32), dv + out[3].astype(jnp.float32)
    got = (jnp.concatenate(o, 1), jnp.concatenate(dq, 1), dk, dv)
    row = {"check": "accuracy", "T": T, "shards": shards, "documents": documents}
    row["window"] = window
    for name, a, b, w in zip(("o", "dq", "dk", "dv"), got, plain, want):
        row[f"rows_err_{name}"] = rel_err(a, w)
        row[f"whole_err_{name}"] = rel_err(b, w)
    if window is None:  # every device's swapped rows, put back at their positions
        pos = jnp.asarray(zigzag.positions(T, shards))
        step = jax.jit(_zigzag_step(shards))
        o, dq, dk, dv = jnp.zeros_like(q), jnp.zeros_like(q), 0.0, 0.0
        for i in range(shards):
            rows = pos[i * L : (i + 1) * L]
            out = step(q[:, rows], k, v, do[:, rows], seg, jnp.int32(i))
            o, dq = o.at[:, rows].set(out[0]), dq.at[:, rows].set(out[1])
            dk, dv = dk + out[2].astype(jnp.float32), dv + out[3].astype(jnp.float32)
        for name, a, w in zip(("o", "dq", "dk", "dv"), (o, dq, dk, dv), want):
            row[f"zigzag_err_{name}"] = rel_err(a, w)
    return row


def timing(T, shards, documents, window):
    B, H, G, D = 1, 4, 4, 128
    L = T // shards
    q, k, v, do, seg = attention_inputs(B, T, H, G, D, documents)
    whole = jax.jit(_whole(functools.partial(attention, window=window, settings=CUDNN)))
    step = jax.jit(_rows_step(shards, L, window))
    last = jnp.int32(shards - 1)
    row = {"check": "timing", "T": T, "shards": shards, "documents": documents, "heads": H}
    row["window"] = window
    row["whole_fwd_bwd_ms"] = median_ms(whole, q, k, v, do, seg)
    row["last_rows_fwd_bwd_ms"] = median_ms(step, q[:, -L:], k, v, do[:, -L:], seg, last)
    row["ratio"] = row["last_rows_fwd_bwd_ms"] / row["whole_fwd_bwd_ms"]
    row["work_ratio"] = _pairs(T - L, T, window) / _pairs(0, T, window)  # the last shard's
    if window is None:
        step = jax.jit(_zigzag_step(shards))
        first = zigzag.positions(T, shards)[:L]  # device 0's rows: the same shapes on each
        row["zigzag_fwd_bwd_ms"] = median_ms(step, q[:, first], k, v, do[:, first], seg, 0)
        row["zigzag_ratio"] = row["zigzag_fwd_bwd_ms"] / row["whole_fwd_bwd_ms"]
        row["zigzag_work"] = sum(_pairs(c * L // 2, (c + 1) * L // 2, None) for c in
                                 zigzag.chunks(0, shards)) / _pairs(0, T, None)  # fmt: skip
    return row


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, nargs="+", default=[8192, 32768, 65536])
    p.add_argument("--shards", type=int, nargs="+", default=[2, 4, 8])
    p.add_argument("--documents-up-to", type=int, default=32768,
                   help="time with documents (a [B, 1, T/n, T] bias) up to this length")  # fmt: skip
    p.add_argument("--windows", type=int, nargs="+", default=[0, 4096],
                   help="sliding windows to time (0: none)")  # fmt: skip
    p.add_argument("--accuracy-tokens", type=int, default=4096)
    p.add_argument("--accuracy-window", type=int, default=1000)
    p.add_argument("--out", default="")
    args = p.parse_args()
    _bench.print_device()
    out = []
    for n in args.shards:
        for docs in (False, True):
            for window in (None, args.accuracy_window):
                _bench.emit(out, accuracy(args.accuracy_tokens, n, docs, window))
    for T in args.tokens:
        for n in args.shards:
            for window in [w or None for w in args.windows]:
                documents = window is None and T <= args.documents_up_to
                for docs in (False, True) if documents else (False,):
                    _bench.emit(out, timing(T, n, docs, window))
    print(f"\n{'T':>6s} {'n':>2s} {'window':>6s} {'docs':>5s} {'whole ms':>9s} {'rows ms':>8s} "
          f"{'ratio':>6s} {'work':>5s} {'zigzag ms':>9s} {'ratio':>6s} {'work':>5s}")  # fmt: skip
    for r in out:
        if r["check"] == "timing":
            z = ("{:9.2f} {:6.2f} {:5.2f}".format(r["zigzag_fwd_bwd_ms"], r["zigzag_ratio"],
                 r["zigzag_work"]) if "zigzag_ratio" in r else "")  # fmt: skip
            print(
                f"{r['T']:6d} {r['shards']:2d} {str(r['window']):>6s} {str(r['documents']):>5s} "
                f"{r['whole_fwd_bwd_ms']:9.2f} {r['last_rows_fwd_bwd_ms']:8.2f} "
                f"{r['ratio']:6.2f} {r['work_ratio']:5.2f} {z}"
            )
    for r in out:
        if r["check"] == "accuracy":
            errs = " ".join(
                f"{n} {r[f'rows_err_{n}']:.1e}/{r[f'whole_err_{n}']:.1e}"
                for n in ("o", "dq", "dk", "dv")
            )
            head = f"accuracy T{r['T']} n{r['shards']} w={r['window']} docs={r['documents']}"
            print(f"{head}: rows/whole {errs}")
            if "zigzag_err_o" in r:
                errs = " ".join(f"{n} {r[f'zigzag_err_{n}']:.1e}" for n in ("o", "dq", "dk", "dv"))
                print(f"{head}: zigzag {errs}")
    _bench.write_jsonl(args.out, out)


if __name__ == "__main__":
    main()
