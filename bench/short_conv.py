r"""Time the GDN short convolution (+ SiLU + per-head L2 norm) implementations, check bf16 error.

  python bench/short_conv.py --shapes 16,2048,832,13 4,8192,1024,16 --impls reference pallas \
      pallas:block_t=32 --out results.jsonl

For each (B, T, C, heads) and normalize in (True, False): forward and forward+backward wall
medians (ms) of each implementation of ``kernels_pallas.short_conv`` on bf16 inputs and, on a
device with a profiler trace, their device time per call (``*_device_ms``: the kernels' sum, no
launch or host overhead; at the model's sizes the wall medians are mostly that overhead), with
the bytes the op must move at least over that time (forward: read x, write y;
forward+backward adds read x and dy, write dx: 2 and 5 passes of B*T*C bf16) beside a
device-to-device copy's rate timed the same way, and the forward+backward's kernels. Each
row's ``rel_err`` is the relative error of its y, dx, dw against the reference in fp32. An
--impls entry "pallas:KEY=VALUE,..." sets fields of ``ShortConvSettings`` (block_t, num_warps;
interpret=True runs the kernels interpreted, on any device).
"""

from __future__ import annotations

import argparse
import functools

import _bench
import jax
import jax.numpy as jnp
import numpy as np
from _bench import device_ms, median_ms, parse_impl, rel_err

from kernels_pallas.short_conv import ShortConvSettings, short_conv_pallas, short_conv_reference


def op(impl, heads, normalize, **kw):
    if impl == "reference":
        return functools.partial(short_conv_reference, heads=heads, normalize=normalize)
    if impl == "pallas":
        return functools.partial(
            short_conv_pallas,
            heads=heads,
            normalize=normalize,
            settings=ShortConvSettings(impl="pallas", **kw),
        )
    raise ValueError(f"unknown impl {impl!r}; known: reference, pallas[:KEY=VALUE,...]")


def fns(f):
    fwd = jax.jit(lambda x, w, seg: f(x, w, seg))

    @jax.jit
    def fwd_bwd(x, w, seg, dy):
        y, vjp = jax.vjp(lambda x, w: f(x, w, seg), x, w)
        return y, *vjp(dy)

    return fwd, fwd_bwd


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", nargs="+", default=["16,2048,832,13"], help="B,T,C,heads")
    ap.add_argument("--impls", nargs="+", default=["reference", "pallas"])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    _bench.print_device()
    rows = []
    copy = jax.jit(lambda x: x + 1)
    for shape in args.shapes:
        B, T, C, heads = map(int, shape.split(","))
        rng = np.random.default_rng(0)
        x = jnp.asarray(rng.normal(size=(B, T, C)), jnp.bfloat16)
        dy = jnp.asarray(rng.normal(size=(B, T, C)), jnp.bfloat16)
        w = jnp.asarray(rng.normal(size=(4, C)) * 0.5, jnp.float32)
        seg = jnp.asarray(np.cumsum(rng.random((B, T)) < 1e-3, axis=1), jnp.int32)
        pass_bytes = B * T * C * 2
        copy_ms = device_ms(copy, x, reps=args.reps)[0] or median_ms(copy, x, reps=args.reps)
        copy_tbs = 2 * pass_bytes / copy_ms / 1e9
        for normalize in (True, False):
            exact = fns(op("reference", heads, normalize))[1](
                x.astype(jnp.float32), w, seg, dy.astype(jnp.float32)
            )
            for spec in args.impls:
                name, kw = parse_impl(spec)
                fwd, fwd_bwd = fns(op(name, heads, normalize, **kw))
                out = fwd_bwd(x, w, seg, dy)
                t_f = median_ms(fwd, x, w, seg, reps=args.reps)
                t_fb = median_ms(fwd_bwd, x, w, seg, dy, reps=args.reps)
                d_f = device_ms(fwd, x, w, seg, reps=args.reps)[0]
                d_fb, kernels = device_ms(fwd_bwd, x, w, seg, dy, reps=args.reps)
                _bench.emit(
                    rows,
                    {
                        "shape": [B, T, C, heads],
                        "normalize": normalize,
                        "impl": spec,
                        "fwd_ms": t_f,
                        "fwd_bwd_ms": t_fb,
                        "fwd_device_ms": d_f,
                        "fwd_bwd_device_ms": d_fb,
                        "fwd_tbs": 2 * pass_bytes / (d_f or t_f) / 1e9,
                        "fwd_bwd_tbs": 5 * pass_bytes / (d_fb or t_fb) / 1e9,
                        "copy_tbs": copy_tbs,
                        "rel_err": {
                            k: rel_err(a, b) for k, a, b in zip(("y", "dx", "dw"), out, exact)
                        },
                        "kernels": kernels,
                    },
                )
    ms = lambda v: f"{v:8.3f}" if v is not None else f"{'n/a':>8}"
    print(
        f"\n{'shape':>22} {'norm':>5} {'impl':>24} {'fwd ms':>8} {'f+b ms':>8} "
        f"{'fwd dev':>8} {'f+b dev':>8} {'f+b TB/s':>9} {'copy TB/s':>9}"
    )
    for r in rows:
        print(
            f"{str(r['shape']):>22} {str(r['normalize']):>5} {r['impl']:>24} "
            f"{ms(r['fwd_ms'])} {ms(r['fwd_bwd_ms'])} {ms(r['fwd_device_ms'])} "
            f"{ms(r['fwd_bwd_device_ms'])} {r['fwd_bwd_tbs']:9.2f} {r['copy_tbs']:9.2f}"
        )
    _bench.write_jsonl(args.out, rows)


if __name__ == "__main__":
    main()
