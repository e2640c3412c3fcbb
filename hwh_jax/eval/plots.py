"""Figures of the evaluation suite: NIAH heatmaps, extrapolation lines, perplexity by position."""

from __future__ import annotations

import re

import numpy as np

from hwh_jax import storage
from hwh_jax.eval.stats import share
from hwh_jax.plotting import finish_line_chart, plain_log_ticks, pyplot, save_figure


def niah_heatmap(rows, task: str, title: str, path: storage.PathLike, train_len: int | None = None):
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
    ax.set_xticks(
        range(len(lengths)), [f"{L:,}" + ("*" if L == train_len else "") for L in lengths]
    )
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
    save_figure(fig, path, dpi=120)


def seed_groups(names) -> dict[str, list[str]]:
    """Model names by their architecture: ``ARCH@seedN`` and ``ARCH/seedN`` under ARCH, any
    other name alone, in the order first seen."""
    groups: dict[str, list[str]] = {}
    for name in names:
        seeded = re.fullmatch(r"(.+)[@/]seed\d+", name)
        groups.setdefault(seeded.group(1) if seeded else name, []).append(name)
    return groups


def extrapolation_chart(per_model: dict, path: storage.PathLike, train_len: int | None = None):
    """NIAH score vs length: one panel per task and one of their mean, one line (one colour) per
    model, with the 95% Wilson interval of each cell's share right as a bar; a model missing a
    cell has a gap there. Models named ``ARCH@seedN`` or ``ARCH/seedN`` of an ARCH with several
    seeds share ARCH's colour: each seed a thin line, and their prompts pooled a thick one with
    the bars."""
    plt = pyplot()
    tasks = sorted({r["task"] for rows in per_model.values() for r in rows})
    lengths = sorted({r["length"] for rows in per_model.values() for r in rows})
    groups = seed_groups(per_model)
    fig, axes = plt.subplots(
        1, len(tasks) + 1, figsize=(3.2 * (len(tasks) + 1), 3.6), sharey=True, squeeze=False
    )
    axes = axes[0]

    def cell(rows, task, L):
        s = [r["score"] for r in rows if r["length"] == L and (task is None or r["task"] == task)]
        if not s:
            return np.nan, 0.0, 0.0
        c = share(s)
        return c["mean"], max(c["mean"] - c["lo"], 0.0), max(c["hi"] - c["mean"], 0.0)

    for i, (group, names) in enumerate(groups.items()):
        colour = f"C{i % 10}"
        x = np.array(lengths) * 1.03 ** (i - (len(groups) - 1) / 2)  # bars side by side
        pooled = [r for name in names for r in per_model[name]]
        label = group if len(names) == 1 else f"{group} ({len(names)} seeds)"
        for ax, task in zip(axes, tasks + [None]):
            if len(names) > 1:
                for name in names:
                    ax.plot(
                        x,
                        [cell(per_model[name], task, L)[0] for L in lengths],
                        color=colour,
                        lw=0.7,
                        alpha=0.35,
                    )
            mean, below, above = np.array([cell(pooled, task, L) for L in lengths]).T
            ax.errorbar(
                x,
                mean,
                yerr=[below, above],
                marker="o",
                color=colour,
                label=label,
                capsize=2,
                lw=1.2 if len(names) == 1 else 2.0,
                elinewidth=0.8,
            )
    for ax, task in zip(axes, tasks + ["mean of the tasks"]):
        if train_len:
            ax.axvline(train_len, color="grey", ls="--", lw=1)
        ax.set_xscale("log", base=2)
        ax.set_xticks(lengths, [str(L) for L in lengths])
        ax.set_ylim(-5, 105)
        ax.set_title(task, fontsize=9)
        ax.set_xlabel("context length (tokens)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("NIAH score; bars: 95% interval\n(dashed: training length)")
    handles, labels = axes[0].get_legend_handles_labels()
    rows = -(-len(labels) // 6)
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 6), fontsize=8)
    fig.tight_layout(rect=(0, 0.04 + 0.06 * rows, 1, 1))
    save_figure(fig, path, dpi=120)


def ppl_chart(per_model: dict, path: storage.PathLike, train_len: int | None = None):
    """Perplexity per position bucket, one line per model, with its 95% interval over the
    evaluation windows as a band (rows with ``ppl_lo``/``ppl_hi``)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, rows in per_model.items():
        mids = [(r["start"] + r["end"]) / 2 for r in rows]
        (line,) = ax.plot(mids, [r["ppl"] for r in rows], marker=".", label=name)
        if all(r.get("ppl_lo") is not None for r in rows):
            ax.fill_between(
                mids,
                [r["ppl_lo"] for r in rows],
                [r["ppl_hi"] for r in rows],
                color=line.get_color(),
                alpha=0.2,
                lw=0,
            )
    if train_len:
        ax.axvline(train_len, color="grey", ls="--", lw=1, label="training length")
    ax.set_yscale("log")
    plain_log_ticks(ax.yaxis)
    finish_line_chart(fig, ax, path, xlabel="position (tokens)", ylabel="perplexity")


def longppl_chart(result: dict, path: storage.PathLike, title: str, train_len: int | None = None):
    """Per position bucket: the loss over all tokens and over the key tokens (lines), and the
    key tokens' share (bars, right axis)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    rows = result["by_position"]
    mids = [(r["start"] + r["end"]) / 2 for r in rows]
    ax.plot(mids, [r["loss"] for r in rows], marker=".", label="all tokens")
    ax.plot(
        mids,
        [np.nan if r["key_loss"] is None else r["key_loss"] for r in rows],
        marker=".",
        label=f"key tokens ({result['key_tokens']} of {result['tokens']})",
    )
    if train_len:
        ax.axvline(train_len, color="grey", ls="--", lw=1, label="training length")
    share_ax = ax.twinx()
    width = 0.8 * (rows[0]["end"] - rows[0]["start"])
    share_ax.bar(
        mids,
        [100 * r["key_tokens"] / r["tokens"] for r in rows],
        width=width,
        color="tab:green",
        alpha=0.2,
    )
    share_ax.set_ylabel("key tokens (%)", color="tab:green")
    share_ax.set_ylim(bottom=0)
    ax.set_zorder(share_ax.get_zorder() + 1)
    ax.patch.set_visible(False)
    ax.set_title(
        f"{title}: LongPPL {result['longppl']:.2f}" if result["longppl"] else title, fontsize=9
    )
    finish_line_chart(fig, ax, path, xlabel="position (tokens)", ylabel="loss (nats/token)")
