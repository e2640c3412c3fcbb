r"""Time the GDN implementations on one accelerator and check their bf16 accuracy.

  python bench/gdn.py --shapes 8,2048,16,128,128 2,8192,16,128,128 --impls pallas chunk_reference \
      --check --breakdown --out results.jsonl

For each (B, T, H, K, V): forward and forward+backward medians (ms) of every JAX implementation
named in --impls, achieved TFLOP/s (forward: 4C(K+V) + 6KV FLOPs per token and head, x3 for
fwd+bwd) and TB/s (q, k, v, o, g, beta read or written once, bf16), against ceilings measured in
the same run (a bf16 8192^3 matmul; a device-to-device copy counting read + write), and each
row's limit (``fwd_limit_ms`` / ``fwd_bwd_limit_ms``): the longer of its FLOPs at the matmul
ceiling and its bytes at the copy ceiling (the backward reads q, k, v, g, beta, do and writes
their gradients once). With
--check, the relative error of bf16 outputs and of every gradient (q, k, v, g, beta) against an
fp32 run of ``chunk_reference`` at full matmul precision (itself tested against the recurrent
form). With --breakdown, each kernel of the Pallas path timed alone (WY inverse + apply, apply
given the inverse, scan forward with and without the chunk-state store, scan backward,
state-path gradients, WY backward). With --profile, each row's device time by kernel from a
profiler trace, and ``fwd_device_ms`` / ``fwd_bwd_device_ms``: first kernel start to last kernel
end per call of calls queued back to back (launch gaps in, the host's dispatch out), the nearest
JAX measure to fla's CUDA-event timings.
--tune times each Pallas kernel over its launch settings (the per-chunk kernels' warps, then the
WY inverse's own, then the scans') and uses the best for the rows.
An --impls entry "pallas:KEY=VALUE,..." is the Pallas path with those options of
``GDNSettings`` (e.g. "pallas:fp32_dots=ieee,chunk_warps=8"), to compare variants
in one run.
fla is timed by bench/fla_gdn_anchor.py in the same command (see
docs/benchmarks.md). Results go to stdout as a table and to --out as JSON lines.
"""

from __future__ import annotations

import argparse
import functools
import json

import _bench
import jax
import jax.numpy as jnp
from _bench import median_ms, rel_err

from kernels_pallas.gdn import GDNSettings, gated_delta_rule, gated_delta_rule_pallas, wy_kernels
from kernels_pallas.gdn.chunk_reference import chunk_local_cumsum
from kernels_pallas.linear_scan import scan as scan_kernels
from kernels_pallas.linear_scan.common import KernelConfig, default_block_v


def inputs(B, T, H, K, V, dtype, seed=0, decay=True):
    ks = jax.random.split(jax.random.key(seed), 6)
    q = jax.random.normal(ks[0], (B, T, H, K))
    k = jax.random.normal(ks[1], (B, T, H, K))
    q = q / jnp.linalg.norm(q, axis=-1, keepdims=True)
    k = k / jnp.linalg.norm(k, axis=-1, keepdims=True)
    v = jax.random.normal(ks[2], (B, T, H, V))
    g = jax.nn.log_sigmoid(jax.random.normal(ks[3], (B, T, H)) + 3.0)
    if not decay:  # DeltaNet: GDN with g = 0
        g = jnp.zeros_like(g)
    beta = jax.nn.sigmoid(jax.random.normal(ks[4], (B, T, H)))
    do = jax.random.normal(ks[5], (B, T, H, V))
    cast = lambda x: x.astype(dtype)
    return cast(q), cast(k), cast(v), g.astype(jnp.float32), cast(beta), cast(do)


def parse_impl(spec):
    """_bench.parse_impl, with options for the pallas path only."""
    name, opts = _bench.parse_impl(spec)
    if opts and name != "pallas":
        raise ValueError(f"--impls {spec!r}: options are for the pallas path only")
    return name, opts


def fns(impl, decay=True, **opts):
    """Jitted forward and forward+backward; ``decay=False``: DeltaNet, the op called with g None
    (g is taken and not used, its gradient zero)."""
    settings = GDNSettings(impl=impl, **opts)

    def fwd(q, k, v, g, beta):
        g = g if decay else None
        if impl == "pallas":
            return gated_delta_rule_pallas(q, k, v, g, beta, settings=settings)[0]
        return gated_delta_rule(q, k, v, g, beta, settings=settings)[0]

    return jax.jit(fwd), jax.jit(_bench.forward_backward(fwd))


def check(impl, shape, opts=None, decay=True):
    B, T, H, K, V = shape
    x16 = inputs(B, T, H, K, V, jnp.bfloat16, seed=1, decay=decay)
    x32 = tuple(a.astype(jnp.float32) for a in x16)
    f16, fb16 = fns(impl, decay, **(opts or {}))
    r32, rb32 = fns("chunk_reference", decay)
    o16, o32 = f16(*x16[:5]), r32(*x32[:5])
    g16, g32 = fb16(*x16)[1:], rb32(*x32)[1:]
    out = {"o": rel_err(o16, o32)}
    out.update(
        {
            f"d{n}": rel_err(a, b)
            for n, a, b in zip(("q", "k", "v", "g", "beta"), g16, g32)
            if decay or n != "g"
        }
    )
    return out


def default_cfg(shape, **over):
    B, T, H, K, V = shape
    kw = dict(chunk=64, layout="triton", block_v=default_block_v("triton", B, H, K, V))
    kw.update(over)
    return KernelConfig(**kw)


def breakdown(shape, x, cfg=None, parts=("chunk", "scan"), reps=20, decay=True):
    """ms of each kernel of the Pallas path alone (plus the XLA cumsum), at ``cfg``; without
    ``decay`` the kernels as DeltaNet runs them (G None)."""
    B, T, H, K, V = shape
    cfg = cfg or default_cfg(shape)
    q, k, v, g, beta, do = x
    C = cfg.chunk
    G = jax.jit(lambda g: chunk_local_cumsum(g, C))(g) if decay else None
    b = beta.astype(jnp.float32)
    S0 = jnp.zeros((B, H, K, V), jnp.float32)
    wy_f = jax.jit(lambda *a: wy_kernels.wy_forward(cfg, *a))
    w, u, qk, X = wy_f(q, k, v, b, G)
    fwd = jax.jit(lambda *a: scan_kernels.scan_forward(cfg, *a))
    fwd_store = jax.jit(lambda *a: scan_kernels.scan_forward(cfg, *a, store=True))
    bwd = jax.jit(lambda *a: scan_kernels.scan_backward(cfg, *a))
    _, _, h, v_new = fwd_store(q, k, w, u, qk, G, S0)
    dv_new, dh, _ = bwd(q, k, w, qk, G, do, S0)
    sg = jax.jit(lambda *a: scan_kernels.state_grads(cfg, *a))
    dq, dk, dw, dG = sg(q, k, G, h, dh, v_new, dv_new, do)
    wy_b = jax.jit(lambda *a: wy_kernels.wy_backward(cfg, *a))
    t = functools.partial(median_ms, reps=reps)
    out = {}
    if "chunk" in parts:
        out.update(
            {
                "wy_fwd_ms": t(wy_f, q, k, v, b, G),
                "wy_fwd_given_inverse_ms": t(wy_f, q, k, v, b, G, X),
                "state_grads_ms": t(sg, q, k, G, h, dh, v_new, dv_new, do),
                "wy_bwd_ms": t(wy_b, k, v, b, G, X, dw, u, dk, dG),
            }
        )
    if "scan" in parts:
        out.update(
            {
                "scan_fwd_ms": t(fwd, q, k, w, u, qk, G, S0),
                "scan_fwd_store_ms": t(fwd_store, q, k, w, u, qk, G, S0),
                "scan_bwd_ms": t(bwd, q, k, w, qk, G, do, S0),
            }
        )
    return out


def tune(shape, x):
    """Launch settings per kernel family, each timed alone; returns the best of each."""
    B, T, H, K, V = shape
    rows, best = [], {}
    for cw in (2, 4, 8):
        r = breakdown(shape, x, default_cfg(shape, chunk_warps=cw), ("chunk",), reps=10)
        rows.append({"shape": list(shape), "chunk_warps": cw, **r})
        print(json.dumps(rows[-1]), flush=True)
        tot = r["wy_fwd_ms"] + r["wy_fwd_given_inverse_ms"] + r["state_grads_ms"] + r["wy_bwd_ms"]
        if tot < best.get("chunk", (1e9,))[0]:
            best["chunk"] = (tot, {"chunk_warps": cw})
    for iw in (1, 2, 4):  # the WY inverse alone: wy_fwd minus wy_fwd given the inverse
        r = breakdown(
            shape, x, default_cfg(shape, inverse_warps=iw, **best["chunk"][1]), ("chunk",), reps=10
        )
        inv = r["wy_fwd_ms"] - r["wy_fwd_given_inverse_ms"]
        rows.append({"shape": list(shape), "inverse_warps": iw, "inverse_ms": inv})
        print(json.dumps(rows[-1]), flush=True)
        if inv < best.get("inverse", (1e9,))[0]:
            best["inverse"] = (inv, {"inverse_warps": iw})
    for bv, nw, ns in (
        (32, 4, 2),
        (32, 8, 2),
        (64, 4, 2),
        (64, 8, 2),
        (64, 4, 1),
        (64, 4, 3),
        (128, 8, 2),
    ):
        if bv > V or V % bv:
            continue
        if True:
            opts = {"block_v": bv, "num_warps": nw, "num_stages": ns}
            try:
                r = breakdown(shape, x, default_cfg(shape, **opts), ("scan",), reps=10)
            except Exception as e:  # noqa: BLE001  (a setting the compiler refuses)
                r = {"error": str(e)[:200]}
            rows.append({"shape": list(shape), **opts, **r})
            print(json.dumps(rows[-1]), flush=True)
            if "error" not in r:
                tot = r["scan_fwd_store_ms"] + r["scan_bwd_ms"]
                if tot < best.get("scan", (1e9,))[0]:
                    best["scan"] = (tot, opts)
    return rows, {**best["chunk"][1], **best["inverse"][1], **best["scan"][1]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", nargs="+", default=["8,2048,16,128,128", "2,8192,16,128,128"])
    ap.add_argument("--impls", nargs="+", default=["chunk_reference"])
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--breakdown", action="store_true")
    ap.add_argument(
        "--tune",
        action="store_true",
        help="time launch settings per kernel and use the best for the pallas rows",
    )
    ap.add_argument(
        "--no_decay",
        action="store_true",
        help="DeltaNet: the GDN op with g None, its kernels without the decay "
        "(fla: chunk_delta_rule)",
    )
    ap.add_argument(
        "--profile",
        action="store_true",
        help="also the device time by kernel of each row (a profiler trace) and "
        "fwd_device_ms / fwd_bwd_device_ms, as bench/decay_attention.py",
    )
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    ceil = _bench.ceilings()
    print(
        json.dumps({"device": jax.devices()[0].device_kind, "jax": jax.__version__, **ceil}),
        flush=True,
    )
    out = open(args.out, "w") if args.out else None  # rows written as they come: kept if cut

    def emit(row):
        _bench.emit(rows, row)
        if out:
            out.write(json.dumps(row) + "\n")
            out.flush()

    rows = []
    decay = not args.no_decay  # --no_decay: DeltaNet
    if out:
        out.write(json.dumps({"ceilings": ceil}) + "\n")
    for spec in args.shapes:
        shape = tuple(int(s) for s in spec.split(","))
        B, T, H, K, V = shape
        x = inputs(*shape, jnp.bfloat16, decay=decay)
        flops_fwd = B * T * H * (4 * 64 * (K + V) + 6 * K * V)
        bytes_fwd = 2 * B * T * H * (2 * K + 2 * V) + 4 * B * T * H * 2
        bytes_fwd_bwd = 2 * B * T * H * (2 * (2 * K + V) + V) + 4 * B * T * H * 4
        limits = {
            "fwd_limit_ms": _bench.limit_ms(flops_fwd, bytes_fwd, ceil),
            "fwd_bwd_limit_ms": _bench.limit_ms(3 * flops_fwd, bytes_fwd_bwd, ceil),
        }
        opts = {}
        if args.tune and any(parse_impl(i)[0] == "pallas" for i in args.impls):
            tuned, opts = tune(shape, x)
            for r in tuned:
                emit(dict(r, impl="tune"))
        for name in args.impls:
            impl, variant = parse_impl(name)
            po = {**opts, **variant} if impl == "pallas" else {}
            row = {"impl": name, "shape": list(shape), "opts": po, "decay": decay, **limits}
            try:
                f, fb = fns(impl, decay, **po)
                row.update(fwd_ms=median_ms(f, *x[:5]), fwd_bwd_ms=median_ms(fb, *x))
                row["fwd_tflops"] = flops_fwd / row["fwd_ms"] / 1e9
                row["fwd_bwd_tflops"] = 3 * flops_fwd / row["fwd_bwd_ms"] / 1e9
                row["fwd_tbps"] = bytes_fwd / row["fwd_ms"] / 1e9
                if args.check:
                    row["rel_err_bf16_vs_fp32"] = check(impl, shape, po, decay=decay)
                if args.profile:
                    row.update(_bench.device_times(f, fb, x[:5], x))
                if args.breakdown and impl == "pallas":
                    row["breakdown"] = breakdown(shape, x, default_cfg(shape, **po), decay=decay)
            except Exception as e:  # noqa: BLE001  (one variant failing to compile: record it)
                row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            emit(row)
    if out:
        out.close()
    print(
        f"\nceilings: bf16 matmul {ceil['matmul_tflops']:.0f} TFLOP/s, copy "
        f"{ceil['copy_tbps']:.2f} TB/s"
    )
    print(
        f"{'impl':32s} {'shape':22s} {'fwd ms':>8s} {'f+b ms':>8s} {'fwd TF/s':>9s} {'TB/s':>6s}"
        f" {'limit fwd / f+b ms':>19s} {'device fwd / f+b ms':>20s}"
    )
    for r in rows:
        if "error" in r:
            print(f"{r['impl']:32s} {str(tuple(r['shape'])):22s} failed: {r['error'][:120]}")
        if "fwd_tflops" not in r:
            continue
        print(
            f"{r['impl']:32s} {str(tuple(r['shape'])):22s} {r['fwd_ms']:8.2f} "
            f"{r['fwd_bwd_ms']:8.2f} {r['fwd_tflops']:9.1f} {r['fwd_tbps']:6.2f}"
            f" {r['fwd_limit_ms']:9.3f} / {r['fwd_bwd_limit_ms']:.3f}"
            + (
                f" {r['fwd_device_ms']:9.2f} / {r['fwd_bwd_device_ms']:.2f}"
                if "fwd_bwd_device_ms" in r
                else ""
            )
        )


if __name__ == "__main__":
    main()
