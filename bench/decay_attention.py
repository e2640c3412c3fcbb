r"""Time gated linear attention with a decay per head (Lightning, RetNet, Mamba-2) or per key
dimension (GLA, HGRN-2: ``--per_key``) on one accelerator and check its bf16 accuracy.

  python bench/decay_attention.py --shapes 8,2048,16,128,128 2,8192,16,128,128 \
      --impls pallas chunk_reference --out results.jsonl

For each (B, T, H, K, V): forward and forward+backward medians (ms) of every implementation in
--impls (``DecaySettings.impl``, launch settings as in ``pallas:num_warps=8``), and the
relative error of bf16 outputs and gradients (q, k, v, g) against an fp32 run of
``chunk_reference`` (itself tested against the recurrent form). fla's
counterparts, ``chunk_simple_gla`` and ``chunk_gla``, are timed by ``bench/fla_gdn_anchor.py
simple_gla SHAPES`` and ``... gla SHAPES`` in the same command. Results go to stdout and to
--out as JSON lines. ``--profile`` adds each row's device time by kernel (forward and
forward+backward, from a profiler trace) to the row and prints it, and ``fwd_device_ms`` /
``fwd_bwd_device_ms``: first kernel start to last kernel end per call of calls queued back to
back, launch gaps in and the host's dispatch out, as fla's CUDA-event timings measure. On a
GPU each row also has its limit (``fwd_limit_ms`` / ``fwd_bwd_limit_ms``): the longer of its
FLOPs (2C(K+V) + 4KV a token and head at chunks of C = 64, x3 with the backward) at the matmul
ceiling and its bytes (q, k, v, g, o once; with the backward the inputs, do and the gradients
once) at the copy ceiling, both measured in the same run (``_bench.ceilings``).
"""

from __future__ import annotations

import argparse

import _bench
import jax
import jax.numpy as jnp

from kernels_pallas.decay_attention import DecaySettings, decay_attention


def inputs(B, T, H, K, V, dtype, seed=0, per_key=False, gate_bias=3.0):
    ks = jax.random.split(jax.random.key(seed), 5)
    q, k = (jax.random.normal(kk, (B, T, H, K)) * K**-0.25 for kk in ks[:2])
    v = jax.random.normal(ks[2], (B, T, H, V))
    g = jax.nn.log_sigmoid(
        jax.random.normal(ks[3], (B, T, H, K) if per_key else (B, T, H)) + gate_bias
    )
    do = jax.random.normal(ks[4], (B, T, H, V))
    cast = lambda x: x.astype(dtype)
    return cast(q), cast(k), cast(v), g.astype(jnp.float32), cast(do)


def fns(impl):
    name, opts = _bench.parse_impl(impl)
    settings = DecaySettings(impl=name, **opts)

    def fwd(q, k, v, g):
        return decay_attention(q, k, v, g, settings=settings)[0]

    return jax.jit(fwd), jax.jit(_bench.forward_backward(fwd))


def _limits(B, T, H, K, V, per_key, ceil, chunk=64):
    n, g = B * T * H, 4 * (K if per_key else 1)  # token-heads; g's bytes (fp32)
    flops = n * (2 * chunk * (K + V) + 4 * K * V)
    fwd_bytes = n * (2 * (2 * K + 2 * V) + g)
    fwd_bwd_bytes = n * (2 * (2 * K + V) * 2 + 2 * V + 2 * g)
    return {
        "fwd_limit_ms": _bench.limit_ms(flops, fwd_bytes, ceil),
        "fwd_bwd_limit_ms": _bench.limit_ms(3 * flops, fwd_bwd_bytes, ceil),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--shapes", nargs="+", default=["8,2048,16,128,128", "2,8192,16,128,128"], help="B,T,H,K,V"
    )
    ap.add_argument("--impls", nargs="+", default=["pallas", "chunk_reference"])
    ap.add_argument("--per_key", action="store_true", help="g [B, T, H, K] (GLA, HGRN-2)")
    ap.add_argument(
        "--gate_bias",
        type=float,
        default=3.0,
        help="g = log_sigmoid(N(0, 1) + this): 3 decays ~5%% a token; -4 ~98%%, "
        "where most chunks take the per-key kernels' exact form",
    )
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument(
        "--profile",
        action="store_true",
        help="also the device time by kernel of each row (a profiler trace)",
    )
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    _bench.print_device()
    ceil = _bench.ceilings() if jax.default_backend() == "gpu" else None  # minutes on a CPU
    if ceil:
        print(ceil, flush=True)
    rows = []
    for spec in args.shapes:
        shape = tuple(int(x) for x in spec.split(","))
        limits = _limits(*shape, args.per_key, ceil) if ceil else {}
        x16 = inputs(*shape, jnp.bfloat16, per_key=args.per_key, gate_bias=args.gate_bias)
        x32 = tuple(a.astype(jnp.float32) for a in x16)
        f32_fwd, f32_fb = fns("chunk_reference")
        o32, g32 = f32_fwd(*x32[:4]), f32_fb(*x32)[1:]
        for impl in args.impls:
            fwd, fwd_bwd = fns(impl)
            fwd, fwd_bwd = fwd.lower(*x16[:4]).compile(), fwd_bwd.lower(*x16).compile()
            row = {
                "op": "decay_attention",
                "impl": impl,
                "shape": list(shape),
                "decay": "per_key" if args.per_key else "per_head",
                "gate_bias": args.gate_bias,
                **limits,
                **_bench.fwd_bwd_row(
                    fwd, fwd_bwd, x16[:4], x16[4], o32, g32, "qkvg", reps=args.reps
                ),
            }
            if args.profile:
                row.update(_bench.device_times(fwd, fwd_bwd, x16[:4], x16))
            _bench.emit(rows, row)
    if args.out:
        _bench.write_jsonl(args.out, rows)


if __name__ == "__main__":
    main()
