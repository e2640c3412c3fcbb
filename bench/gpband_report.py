r"""GPBand over seeds: the table and figure of docs/results.md from ``bench/gpband_runs.sh`` runs.

  python bench/gpband_report.py measurements/gpband_w4096 --out=docs/img/gpband_w4096.png

Reads ``FOLDER/seed<S>_L<L>/{analysis.json,summary.json}`` (one Transformer trained at length L
with seed S, analysed by ``launch.analyze``) and prints, per training length: each seed's band
(frequency indices lo..hi, their rotation periods in tokens), the band's long-period edge in
tokens and over L, the held-out loss, and the mean edge index over seeds with its 95% t
interval (the seed as the unit). The figure: mean RPD against rotation period, one line a run
(colour by length), and each run's edge against its training length.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re

import numpy as np

from hwh_jax.eval.stats import seeds_interval
from hwh_jax.plotting import pyplot, save_figure


def load(folder: pathlib.Path) -> dict[int, dict[int, dict]]:
    """{length: {seed: {"band", "periods", "rpd", "loss", "window"}}} of every run folder."""
    runs: dict[int, dict[int, dict]] = {}
    for d in sorted(folder.iterdir()):
        m = re.fullmatch(r"seed(\d+)_L(\d+)", d.name)
        if not m:
            continue
        a = json.loads((d / "analysis.json").read_text())
        s = json.loads((d / "summary.json").read_text())
        rpd = np.concatenate([np.asarray(l["rpd"]) for l in a["layers"] if l["heads"]], 0)
        runs.setdefault(int(m[2]), {})[int(m[1])] = {
            "band": a["band"],
            "periods": np.asarray(a["periods"]),
            "rpd": rpd.mean(0),
            "loss": s["final_heldout_loss"],
            "window": a["seq_len"],
        }
    if not runs:
        raise SystemExit(f"{folder}: no seed<S>_L<L> run folders")
    return runs


def table(runs) -> str:
    lines = [
        "| training length L | seed | band (indices) | band periods (tokens) | edge / L | "
        "held-out loss |",
        "|---:|---:|---|---|---:|---:|",
    ]
    summary = [
        "| training length L | seeds | edge index, mean [95% t] | edge period (tokens), "
        "seeds | edge / L, seeds |",
        "|---:|---:|---|---|---|",
    ]
    for length, seeds in sorted(runs.items()):
        edges = []
        for seed, r in sorted(seeds.items()):
            b, p = r["band"], r["periods"]
            edges.append(b["hi"])
            lines.append(
                f"| {length} | {seed} | {b['lo']}..{b['hi']} | {p[b['lo']]:,.0f} .. "
                f"{p[b['hi']]:,.0f} | {p[b['hi']] / length:.2f} | {r['loss']:.3f} |"
            )
        ci = seeds_interval(edges)
        ci_s = f"[{ci[0]:.1f}, {ci[1]:.1f}]" if ci else "(one seed)"
        p = next(iter(seeds.values()))["periods"]
        summary.append(
            f"| {length} | {len(edges)} | {np.mean(edges):.2f} {ci_s} | "
            f"{', '.join(f'{p[e]:,.0f}' for e in edges)} | "
            f"{', '.join(f'{p[e] / length:.1f}' for e in edges)} |"
        )
    window = {r["window"] for s in runs.values() for r in s.values()}
    return f"analysis window: {sorted(window)} tokens\n\n" + "\n".join(lines + [""] + summary)


def figure(runs, path: pathlib.Path) -> None:
    plt = pyplot()
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [2, 1]})
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for (length, seeds), color in zip(sorted(runs.items()), colors):
        for i, (seed, r) in enumerate(sorted(seeds.items())):
            ax.plot(
                r["periods"], r["rpd"], color=color, lw=1, label=f"L={length}" if i == 0 else None
            )
            edge = r["periods"][r["band"]["hi"]]
            bx.scatter([length * (1 + 0.04 * (i - 1))], [edge], color=color, s=20)
        ax.axvline(length, color=color, ls="--", lw=0.8)
    lengths = sorted(runs)
    bx.plot(lengths, [2 * x for x in lengths], "k--", lw=0.8, label="2L")
    for a in (ax, bx):
        a.set_xscale("log")
    bx.set_yscale("log")
    ax.set_xlabel("rotation period (tokens); dashed: training lengths")
    ax.set_ylabel("mean RPD over heads")
    ax.legend(fontsize=8)
    bx.set_xlabel("training length L (tokens)")
    bx.set_ylabel("band's long-period edge (tokens)")
    bx.minorticks_off()
    bx.set_xticks(lengths, [str(x) for x in lengths])
    bx.set_yticks([500, 1000, 2000, 4000], ["500", "1,000", "2,000", "4,000"])
    bx.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path, dpi=120)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=pathlib.Path)
    ap.add_argument("--out", type=pathlib.Path, help="figure path (.png)")
    args = ap.parse_args()
    runs = load(args.folder)
    print(table(runs))
    if args.out:
        figure(runs, args.out)
        print(f"figure: {args.out}")


if __name__ == "__main__":
    main()
