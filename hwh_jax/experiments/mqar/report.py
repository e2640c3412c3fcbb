"""The MQAR sweep's cells from its rows (``summarize``: the seeds' mean and sd, the pooled share
right with its Wilson interval), its table and its figure."""

from __future__ import annotations

import statistics

from hwh_jax import storage
from hwh_jax.eval import stats
from hwh_jax.plotting import pyplot, save_figure


def summarize(rows: list[dict]) -> list[dict]:
    """One cell per (arch, width, setting): the seeds' accuracies, mean, sd, and the pooled
    share right with its 95% Wilson interval."""
    cells = {}
    for r in rows:
        cells.setdefault((r["arch"], r["width"], r["seq_len"], r["pairs"]), []).append(r)
    out = []
    for (arch, width, length, pairs), rs in cells.items():
        acc = [r["accuracy"] for r in rs]
        right, n = sum(r["right"] for r in rs), sum(r["queries"] for r in rs)
        lo, hi = stats.wilson(right, n)
        out.append(
            {
                "arch": arch,
                "width": width,
                "seq_len": length,
                "pairs": pairs,
                "seeds": len(rs),
                "accuracies": acc,
                "mean": statistics.mean(acc),
                "std": statistics.stdev(acc) if len(acc) > 1 else 0.0,
                "queries": n,
                "lo": lo,
                "hi": hi,
                "lrs": [r["lr"] for r in rs],
            }
        )
    return out


def table(cells: list[dict]) -> str:
    """Markdown: a row per (arch, width), a column per setting: mean +- sd [pooled interval]."""
    settings = sorted({(c["seq_len"], c["pairs"]) for c in cells})
    by = {(c["arch"], c["width"], c["seq_len"], c["pairs"]): c for c in cells}
    rows = sorted({(c["arch"], c["width"]) for c in cells}, key=lambda k: (k[0], k[1]))
    lines = [
        "| arch | width | " + " | ".join(f"T={t}, {p} pairs" for t, p in settings) + " |",
        "|---|---:|" + "---:|" * len(settings),
    ]
    for arch, width in rows:
        cells_ = [by.get((arch, width, t, p)) for t, p in settings]
        lines.append(
            f"| {arch} | {width} | "
            + " | ".join(
                "-"
                if c is None
                else f"{100 * c['mean']:.1f} +- {100 * c['std']:.1f} "
                f"[{100 * c['lo']:.1f}-{100 * c['hi']:.1f}]"
                for c in cells_
            )
            + " |"
        )
    return "\n".join(lines)


def figure(cells: list[dict], path: storage.PathLike):
    """Zoology's figure: a panel per sequence length, accuracy against width (log), a line per
    architecture through the mean over seeds and every seed's accuracy as a dot (three seeds
    tell more than a standard deviation: one seed that has not learned shows as a lone dot)."""
    plt = pyplot()
    settings = sorted({(c["seq_len"], c["pairs"]) for c in cells})
    archs = sorted({c["arch"] for c in cells})
    fig, axes = plt.subplots(
        1, len(settings), figsize=(3.2 * len(settings), 3.2), sharey=True, squeeze=False
    )
    for ax, (length, pairs) in zip(axes[0], settings):
        for i, arch in enumerate(archs):
            cs = sorted(
                (
                    c
                    for c in cells
                    if c["arch"] == arch and c["seq_len"] == length and c["pairs"] == pairs
                ),
                key=lambda c: c["width"],
            )
            shift = 2 ** (0.06 * (i - (len(archs) - 1) / 2))  # apart on the log axis
            (line,) = ax.plot(
                [c["width"] * shift for c in cs],
                [c["mean"] for c in cs],
                marker="o",
                ms=3,
                label=arch,
            )
            ax.plot(
                [c["width"] * shift for c in cs for _ in c["accuracies"]],
                [a for c in cs for a in c["accuracies"]],
                ls="none",
                marker=".",
                ms=4,
                alpha=0.5,
                color=line.get_color(),
            )
        ax.set_xscale("log", base=2)
        widths = sorted({c["width"] for c in cells})
        ax.set_xticks(widths, [str(w) for w in widths])  # the widths trained, at their ticks
        ax.minorticks_off()
        ax.set_xlim(widths[0] / 1.6, widths[-1] * 1.6)  # points off the axis edges
        ax.set_title(f"T={length}, {pairs} pairs", fontsize=9)
        ax.set_xlabel("model width")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("MQAR accuracy (line: mean; dots: seeds)")
    axes[0][0].legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
