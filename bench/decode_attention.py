r"""Time one decode step's attention over a KV cache (``kernels_pallas.decode_attention``) per
implementation, against the bandwidth its cache read needs; check its bf16 error.

  python bench/decode_attention.py --shapes 32,32768,5,64 1,32768,5,64 32,32768,16,64 \
      --impls reference pallas pallas:block=64 --out results.jsonl

For each (B, S slots, G kv heads, D) with one query head a kv head (--q_per_kv for GQA), every
slot written and visible: the wall median (ms) of each implementation on bf16 q, k, v, and on a
device with a profiler trace its device time per call (``device_ms``: the kernels' sum) and
kernels, the bytes the step must read at least (k and v: 2 x B x S x G x D x 2) over that
time (``tb_per_s``), and ``x_floor``: that time over the same bytes at the device's peak memory
bandwidth (``hwh_jax.inference.roofline``, the decode tables' floor).
``rel_err``: the output's relative error against the fp32 reference. An --impls entry
"pallas:KEY=VALUE,..." sets ``DecodeAttentionSettings`` fields (block, min_programs, num_warps,
num_stages).
"""

from __future__ import annotations

import argparse

import _bench
import jax
import jax.numpy as jnp
from _bench import device_ms, median_ms, parse_impl, rel_err

from hwh_jax.inference.roofline import peak_memory_bandwidth
from kernels_pallas import DecodeAttentionSettings, cached_attention, decode_attention


def case(B, S, G, D, q_per_kv):
    keys = jax.random.split(jax.random.key(0), 3)
    q = jax.random.normal(keys[0], (B, 1, G * q_per_kv, D), jnp.float32)
    k = jax.random.normal(keys[1], (B, S, G, D), jnp.float32)
    v = jax.random.normal(keys[2], (B, S, G, D), jnp.float32)
    times = dict(
        q_time=jnp.array([S - 1], jnp.int32),
        k_time=jnp.arange(S, dtype=jnp.int32),
        k_start=jnp.zeros((B,), jnp.int32),
    )
    return q, k, v, times


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--shapes",
        nargs="+",
        default=["32,32768,5,64", "1,32768,5,64"],
        help="B,S,G,D: rows, cache slots, kv heads, head dim",
    )
    ap.add_argument("--q_per_kv", type=int, default=1)
    ap.add_argument("--impls", nargs="+", default=["reference", "pallas"])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    _bench.print_device()
    peak = peak_memory_bandwidth(jax.devices()[0].device_kind)
    rows = []
    for shape in args.shapes:
        B, S, G, D = (int(x) for x in shape.split(","))
        q, k, v, times = case(B, S, G, D, args.q_per_kv)
        want = jax.jit(lambda q, k, v: cached_attention(q, k, v, **times))(q, k, v)
        bf = [x.astype(jnp.bfloat16) for x in (q, k, v)]
        nbytes = 2 * B * S * G * D * 2
        for spec in args.impls:
            impl, opts = parse_impl(spec)
            settings = DecodeAttentionSettings(impl=impl, **opts)
            fn = jax.jit(lambda q, k, v, s=settings: decode_attention(q, k, v, settings=s, **times))
            row = {
                "op": "decode_attention",
                "impl": spec,
                "shape": [B, S, G, D],
                "q_per_kv": args.q_per_kv,
                "bytes": nbytes,
                "ms": median_ms(fn, *bf, reps=args.reps),
                "rel_err": rel_err(fn(*bf).astype(jnp.float32), want),
            }
            dev, kernels = device_ms(fn, *bf, reps=args.reps)
            if dev is not None:
                row.update(device_ms=dev, kernels=kernels, tb_per_s=nbytes / dev / 1e9)
                if peak:
                    row.update(x_floor=dev / (nbytes / peak * 1e3))
            _bench.emit(rows, row)
            _bench.write_jsonl(args.out, rows)


if __name__ == "__main__":
    main()
