"""Figures of the evaluation suite: NIAH heatmaps, extrapolation lines, perplexity by position."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from hwh_jax.plotting import finish_line_chart, pyplot


def niah_heatmap(rows, task: str, title: str, path: Path, train_len: int | None = None):
    """Depth (rows) x length (columns) mean score of one task for one model."""
    plt = pyplot()
    rows = [r for r in rows if r["task"] == task]
    lengths = sorted({r["length"] for r in rows})
    depths = sorted({r["depth"] for r in rows})
    grid = np.full((len(depths), len(lengths)), np.nan)
    for i, d in enumerate(depths):
        for j, L in enumerate(lengths):
            s = [r["score"] for r in rows if r["depth"] == d and r["length"] == L]
            grid[i, j] = np.mean(s) if s else np.nan
    fig, ax = plt.subplots(figsize=(1.2 + 0.9 * len(lengths), 1.5 + 0.25 * len(depths)))
    im = ax.imshow(grid, cmap="RdYlGn", vmin=0, vmax=100, aspect="auto")
    ax.set_xticks(range(len(lengths)), [f"{L:,}" + ("*" if L == train_len else "")
                                        for L in lengths])
    ax.set_yticks(range(len(depths)), [f"{d}%" for d in depths])
    ax.set_xlabel("context length (tokens; * = training length)")
    ax.set_ylabel("needle depth")
    for i in range(len(depths)):
        for j in range(len(lengths)):
            if not np.isnan(grid[i, j]):
                ax.text(j, i, f"{grid[i, j]:.0f}", ha="center", va="center", fontsize=7)
    fig.colorbar(im, ax=ax, label="score")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def extrapolation_chart(per_model: dict, path: Path, train_len: int | None = None):
    """Mean NIAH score vs length, one line per (model, task)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, rows in per_model.items():
        for task in sorted({r["task"] for r in rows}):
            lengths = sorted({r["length"] for r in rows if r["task"] == task})
            means = [np.mean([r["score"] for r in rows if r["task"] == task and
                              r["length"] == L]) for L in lengths]
            ax.plot(lengths, means, marker="o", label=f"{name} {task}")
    if train_len:
        ax.axvline(train_len, color="grey", ls="--", lw=1, label="training length")
    ax.set_xscale("log", base=2)
    ax.set_ylim(-5, 105)
    finish_line_chart(fig, ax, path, xlabel="context length (tokens)", ylabel="NIAH score",
                      legend_size=7)


def ppl_chart(per_model: dict, path: Path, train_len: int | None = None):
    """Perplexity per position bucket, one line per model."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, rows in per_model.items():
        mids = [(r["start"] + r["end"]) / 2 for r in rows]
        ax.plot(mids, [r["ppl"] for r in rows], marker=".", label=name)
    if train_len:
        ax.axvline(train_len, color="grey", ls="--", lw=1, label="training length")
    ax.set_yscale("log")
    finish_line_chart(fig, ax, path, xlabel="position (tokens)", ylabel="perplexity")
