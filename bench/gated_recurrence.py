r"""Time HGRN's element-wise gated recurrence, h_t = a_t * h_{t-1} + b_t, on one accelerator and
check its bf16 accuracy.

  python bench/gated_recurrence.py --shapes 8,2048,2048 2,8192,2048 --out results.jsonl

For each (B, T, D): forward and forward+backward medians (ms) of each --impls entry of
``gated_recurrence`` ("scan": XLA's associative scan; "pallas": the chunked Pallas kernels, with
``GatedRecurrenceSettings`` options as "pallas:chunk_size=128,block_d=64") and of
``gated_recurrence_recurrent`` (``lax.scan`` over tokens, with --recurrent: slow on long
sequences), and the relative error of bf16 inputs' outputs and
gradients against an fp32 run of the recurrent form. fla's counterpart, ``chunk_hgrn`` (its
gate the log of a), is timed by ``bench/fla_gdn_anchor.py hgrn B,T,1,D,D`` in the same
command. ``--profile`` adds each row's device time by kernel and ``fwd_device_ms`` /
``fwd_bwd_device_ms`` (as ``bench/decay_attention.py``), the measure to set beside fla's
CUDA-event timings. Results go to stdout and to --out as JSON lines.
"""

from __future__ import annotations

import argparse

import _bench
import jax
import jax.numpy as jnp

from kernels_pallas.gated_recurrence import GatedRecurrenceSettings, gated_recurrence


def inputs(B, T, D, dtype, seed=0):
    ks = jax.random.split(jax.random.key(seed), 3)
    a = jax.nn.sigmoid(jax.random.normal(ks[0], (B, T, D)) + 3.0)  # forget gates near 0.95
    b = (1 - a) * jax.random.normal(ks[1], (B, T, D))
    do = jax.random.normal(ks[2], (B, T, D))
    return a.astype(dtype), b.astype(dtype), do.astype(dtype)


def fns(impl):
    name, opts = _bench.parse_impl(impl)
    settings = GatedRecurrenceSettings(impl=name, **opts)

    def fwd(a, b):
        return gated_recurrence(a, b, settings=settings)[0]

    return jax.jit(fwd), jax.jit(_bench.forward_backward(fwd))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", nargs="+", default=["8,2048,2048", "2,8192,2048"], help="B,T,D")
    ap.add_argument("--impls", nargs="+", default=["scan", "pallas"])
    ap.add_argument("--recurrent", action="store_true", help="also time the lax.scan form")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument(
        "--profile",
        action="store_true",
        help="also the device time by kernel of each row (a profiler trace)",
    )
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    _bench.print_device()
    rows = []
    for spec in args.shapes:
        shape = tuple(int(x) for x in spec.split(","))
        x16 = inputs(*shape, jnp.bfloat16)
        x32 = tuple(x.astype(jnp.float32) for x in x16)
        ref_fwd, ref_fb = fns("recurrent")
        h32, g32 = ref_fwd(*x32[:2]), ref_fb(*x32)[1:]
        for impl in args.impls + (["recurrent"] if args.recurrent else []):
            fwd, fwd_bwd = fns(impl)
            row = {
                "op": "gated_recurrence",
                "impl": impl,
                "shape": list(shape),
                **_bench.fwd_bwd_row(
                    fwd, fwd_bwd, x16[:2], x16[2], h32, g32, "ab", out="h", reps=args.reps
                ),
            }
            if args.profile:
                row.update(_bench.device_times(fwd, fwd_bwd, x16[:2], x16))
            _bench.emit(rows, row)
    if args.out:
        _bench.write_jsonl(args.out, rows)


if __name__ == "__main__":
    main()
