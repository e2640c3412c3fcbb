r"""A decode step's products alone: ``kernels_pallas.skinny_matmul`` against XLA's product, at a
model's projection shapes.

  python bench/skinny_matmul.py --arch hwh --size 380m --rows 1 32 \
      --impls xla pallas pallas:min_programs=512 --profile /tmp/prof --out rows.jsonl

A row is one (impl, rows, kind) for the model's layers: one jitted call multiplies x [rows, d_in]
by every layer's weight of that kind in turn, as a decode step does (each layer's weight a
distinct array, so the L2 cache holds none of them from one product to the next; each product
ordered after the one before, ``chain``). Kinds: "in" (the mixer's input projections as one
weight), "o" (o_proj), "gate_up" (the MLP's gate and up as one), "down", and "step" (all four,
layer by layer). ``ms`` is the call's wall-clock median,
``us_per_product`` and ``tb_per_s`` (the weights' bf16 bytes over that time), ``rel_err`` the
outputs' largest error against XLA's product relative to its largest entry; --profile DIR adds
``device_ms``, the kernels' time per call from a profiler trace of 5 calls kept under DIR (the
host's dispatch and launch gaps out), with its ``device_tb_per_s`` and kernels. Impls: "xla"
is ``linear.matmul`` without settings (a lone row as the first of two: the decode step without
the kernel);
"pallas[:KEY=VALUE,...]" is ``skinny_matmul`` with those ``SkinnyMatmulSettings`` fields
(``max_rows`` at least the rows). --interpret runs the kernel in the generic interpreter (a CPU
check of the script; its times mean nothing).
"""

from __future__ import annotations

import argparse
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from _bench import emit, median_ms, parse_impl, print_device, write_jsonl
from flax import nnx

from hwh_jax.layers.linear import matmul
from hwh_jax.models import HybridLM, model_config
from hwh_jax.profiling import profile
from kernels_pallas.skinny_matmul import SkinnyMatmulSettings, skinny_matmul

KINDS = ("in", "o", "gate_up", "down")


def product_shapes(arch: str, size: str) -> dict[str, list[tuple[int, int]]]:
    """{kind: [(d_in, d_out) of each layer]} of a model's decode products (no weights made)."""
    model = nnx.eval_shape(lambda: HybridLM(model_config(arch, size), rngs=nnx.Rngs(0)))
    shapes = {k: [] for k in KINDS}
    for block in model.blocks:
        fa, la = block.mixer.input_projections()
        shapes["in"].append(
            (block.mixer.o_proj.kernel.shape[1], sum(p.kernel.shape[1] for p in fa + la))
        )
        shapes["o"].append(tuple(block.mixer.o_proj.kernel.shape))
        gate = block.mlp.gate.kernel.shape
        shapes["gate_up"].append((gate[0], 2 * gate[1]))
        shapes["down"].append(tuple(block.mlp.down.kernel.shape))
    return shapes


def product_fn(impl: str, rows: int, interpret: bool):
    """f(x, w) -> x @ w for one impl entry."""
    name, opts = parse_impl(impl)
    if name == "xla":
        return matmul
    if name != "pallas":
        raise ValueError(f"--impls: xla or pallas[:KEY=VALUE,...], got {impl!r}")
    settings = SkinnyMatmulSettings(
        impl="pallas", interpret=interpret, **{"max_rows": max(rows, 1), **opts}
    )
    return lambda x, w: skinny_matmul(x, w, settings=settings)


def chain(f, xs, ws):
    """Every product in turn, each after the one before (as a decode step's are): left
    independent, XLA's GPU compiler concatenates the weights that share an input into one
    product (a copy of them all each call), which a step never does."""
    outs, last = [], None
    for w in ws:
        x = xs[w.shape[0]]
        if last is not None:
            x, _ = jax.lax.optimization_barrier((x, last))
        last = f(x, w)
        outs.append(last)
    return outs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", default="hwh")
    ap.add_argument("--size", default="380m")
    ap.add_argument("--rows", nargs="+", type=int, default=[1, 32])
    ap.add_argument("--impls", nargs="+", default=["xla", "pallas"])
    ap.add_argument("--kinds", nargs="+", default=[*KINDS, "step"], choices=[*KINDS, "step"])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument(
        "--profile",
        default="",
        help="directory: also the kernels' device time per call from a profiler trace kept there",
    )
    ap.add_argument(
        "--interpret",
        action="store_true",
        help="run the kernel in the generic interpreter (a CPU check)",
    )
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    print_device()
    shapes = product_shapes(args.arch, args.size)
    key = jax.random.key(0)
    weights = {}  # (d_in, d_out) -> one bf16 weight per layer
    for kind in KINDS:
        for i, shape in enumerate(shapes[kind]):
            weights[kind, i] = jax.random.normal(
                jax.random.fold_in(key, len(weights)), shape, jnp.bfloat16
            ) / math.sqrt(shape[0])
    layers = len(shapes["in"])
    rows_out = []
    for impl in args.impls:
        for rows in args.rows:
            f = product_fn(impl, rows, args.interpret)
            for kind in args.kinds:
                kinds = KINDS if kind == "step" else (kind,)
                ws = [weights[k, i] for i in range(layers) for k in kinds]
                xs = {
                    d: jax.random.normal(jax.random.fold_in(key, d), (rows, d), jnp.bfloat16)
                    for d in {w.shape[0] for w in ws}
                }
                call = jax.jit(functools.partial(chain, f))
                nbytes = sum(w.size * w.dtype.itemsize for w in ws)
                row = {
                    "arch": args.arch,
                    "size": args.size,
                    "impl": impl,
                    "rows": rows,
                    "kind": kind,
                    "products": len(ws),
                    "weight_bytes": nbytes,
                }
                row["ms"] = median_ms(call, xs, ws, reps=args.reps)
                row["us_per_product"] = 1e3 * row["ms"] / len(ws)
                row["tb_per_s"] = nbytes / row["ms"] / 1e9
                want = jax.jit(functools.partial(chain, matmul))(xs, ws)
                row["rel_err"] = max(
                    float(
                        np.max(np.abs(np.asarray(a, np.float32) - np.asarray(b, np.float32)))
                        / np.max(np.abs(np.asarray(b, np.float32)))
                    )
                    for a, b in zip(call(xs, ws), want)
                )
                if args.profile:
                    trace = f"{args.profile}/{impl}_{rows}_{kind}".replace(":", "_")
                    with profile.capture(trace):
                        for _ in range(5):
                            out = call(xs, ws)
                        jax.block_until_ready(out)
                    s = profile.summarize(trace, steps=5)
                    if s["top_kernels_ms"]:  # none on the CPU backend
                        row.update(
                            device_ms=s["kernel_ms"],
                            device_tb_per_s=nbytes / s["kernel_ms"] / 1e9,
                            kernels=s["top_kernels_ms"],
                        )
                emit(rows_out, row)
                write_jsonl(args.out, rows_out)
    print(
        f"\n{'impl':36s} {'rows':>4s} {'kind':>8s} {'products':>8s} {'ms':>8s} "
        f"{'us each':>8s} {'TB/s':>6s} {'device ms':>9s} {'TB/s':>6s}"
    )
    for r in rows_out:
        dev = (
            f"{r['device_ms']:9.3f} {r['device_tb_per_s']:6.2f}"
            if "device_ms" in r
            else f"{'-':>9s} {'-':>6s}"
        )
        print(
            f"{r['impl']:36s} {r['rows']:4d} {r['kind']:>8s} {r['products']:8d} "
            f"{r['ms']:8.3f} {r['us_per_product']:8.2f} {r['tb_per_s']:6.2f} {dev}"
        )


if __name__ == "__main__":
    main()
