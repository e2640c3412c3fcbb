r"""docs/tpu.md's sizing table from ``launch.plan``'s JSON files (``--out`` folders or files).

  python bench/plan_table.py measurements/benchmark_rows/2026-12-05-cpu/plan_*.json

One row a plan: model, context, slice and mesh, whether it fits, memory per chip, the
micro-batch and accumulation (and the remat policy the planner settled on, in plans that
record it), the compiler's FLOPs and bytes per chip a step (a loop body
scaled by its trip count; the Mosaic kernels' own work is not in XLA's cost analysis), the bytes a chip sends a step (ring algorithm), the estimated step
(everything overlapped - nothing overlapped) and tokens/s. A plan that did not fit shows its
error's first clause.
"""

from __future__ import annotations

import argparse
import json
import pathlib

GIB = 2**30


def row(r: dict) -> str:
    if not r.get("fits", False) and "error" in r:
        mesh = ",".join(str(v) for v in r.get("mesh", []))
        why = r["error"].replace("RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. ", "")
        return (
            f"| {r.get('arch', '?')} {r.get('seq_len', 0) // 1024}K | {r['topology']}, "
            f"{mesh} | no: {why[:140]} | | | | | |"
        )
    m, p, e, c = r["memory"], r["plan"], r["estimate"], r["cost"]
    sent = sum(v["wire_bytes"] for v in r["collectives"].values())
    mesh = ",".join(str(v) for v in r["mesh"].values())
    return (
        f"| {r['arch']} {r['seq_len'] // 1024}K | {r['topology']} ({r['chips']}), {mesh} | "
        f"{'yes' if r['fits'] else 'no'}: {m['step_bytes'] / GIB:.1f} of "
        f"{m['hbm'] / GIB:.0f} GiB | {p['micro_batch']} x {p['grad_accum']}"
        f"{', remat ' + p['remat'] if p.get('remat') else ''} | "
        f"{c['flops'] * p['grad_accum'] / 1e12:.0f} TFLOP, "
        f"{c['bytes_accessed'] * p['grad_accum'] / GIB:,.0f} GiB | {sent / GIB:.1f} GiB | "
        f"{e['step_s_overlapped']:.2f}-{e['step_s_serial']:.2f} s | "
        f"{e['tokens_per_s_serial'] / 1e3:,.0f}k-{e['tokens_per_s_overlapped'] / 1e3:,.0f}k |"
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("plans", nargs="+", help="plan.json files or folders holding one")
    args = ap.parse_args()
    print(
        "| model, context | slice (chips), mesh | fits: memory a chip | micro-batch x "
        "accumulation | compiler, a chip a step | sent a chip a step | estimated step | "
        "tokens/s |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name in args.plans:
        path = pathlib.Path(name)
        path = path / "plan.json" if path.is_dir() else path
        print(row(json.loads(path.read_text())))


if __name__ == "__main__":
    main()
