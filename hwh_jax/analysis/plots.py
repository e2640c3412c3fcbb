"""Figures of the frequency analysis: per-layer RFIS / RPD heatmaps, the GPBand profile, and
retrieval heads over depth."""

from __future__ import annotations

import numpy as np

from hwh_jax import storage
from hwh_jax.plotting import finish_line_chart, integer_ticks, pyplot, save_figure


def _period_ticks(ax, periods, train_len):
    F = len(periods)
    ticks = sorted(set(np.linspace(0, F - 1, min(F, 6)).round().astype(int)))
    ax.set_xticks(ticks, [f"{periods[t]:.0f}" for t in ticks], fontsize=7)
    ax.set_xlabel("frequency index r -> rotation period 2pi/w_r (tokens)", fontsize=8)
    if train_len:
        r = np.interp(np.log(train_len), np.log(periods), np.arange(F))
        ax.axvline(r, color="white", ls="--", lw=1)


def layer_heatmaps(result: dict, path_prefix: storage.PathLike, title: str):
    """One PNG per analysed layer: RFIS and RPD, heads x frequency, band and training length."""
    plt = pyplot()
    periods = np.asarray(result["periods"])
    band, L = result["band"], result["band"].get("train_len")
    for layer in result["layers"]:
        if not layer["heads"]:
            continue
        fig, axes = plt.subplots(1, 2, figsize=(10, 1.2 + 0.22 * layer["heads"]))
        for ax, key in zip(axes, ("rfis", "rpd")):
            im = ax.imshow(np.asarray(layer[key]), aspect="auto", cmap="magma", vmin=0)
            ax.set_ylabel("head", fontsize=8)
            integer_ticks(ax.yaxis)
            kinds = "".join("R" if h["kind"] == "retrieval" else "P" for h in layer["taxonomy"])
            scheme = "RoPE" if layer.get("rope", True) else "NoPE"
            ax.set_title(
                f"{key.upper()} layer {layer['layer']}, {scheme} heads: {kinds} "
                f"(R retrieval, P positional)",
                fontsize=8,
            )
            _period_ticks(ax, periods, L)
            ax.axvspan(band["lo"] - 0.5, band["hi"] + 0.5, color="cyan", alpha=0.15)
            fig.colorbar(im, ax=ax)
        fig.suptitle(title + "  (dashed: training length; cyan: GPBand)", fontsize=8)
        fig.tight_layout()
        save_figure(fig, f"{path_prefix}_layer{layer['layer']:02d}.png", dpi=110)


def band_profile(results: dict, path: storage.PathLike):
    """Mean RPD per frequency against rotation period, one line per model, bands shaded,
    training lengths dashed: does the band move with the training length?"""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for (name, r), color in zip(results.items(), plt.rcParams["axes.prop_cycle"].by_key()["color"]):
        periods = np.asarray(r["periods"])
        rpd = np.concatenate([np.asarray(l["rpd"]) for l in r["layers"] if l["heads"]], 0)
        ax.plot(periods, rpd.mean(0), color=color, label=name)
        b = r["band"]
        ax.axvspan(periods[b["lo"]], periods[b["hi"]], color=color, alpha=0.15)
        if b.get("train_len"):
            ax.axvline(b["train_len"], color=color, ls="--", lw=1)
    ax.set_xscale("log")
    finish_line_chart(
        fig, ax, path, xlabel="rotation period (tokens)", ylabel="mean RPD over heads (bits)"
    )


def retrieval_by_depth(result: dict, path: storage.PathLike, title: str):
    plt = pyplot()
    counts = result["counts"]
    heads = [l["heads"] for l in result["layers"]]
    fig, ax = plt.subplots(figsize=(6, 3))
    ax.bar(range(len(counts)), heads, color="lightgrey", label="FA heads analysed")
    ax.bar(range(len(counts)), counts, color="tab:red", label="retrieval heads")
    ax.set_xlabel("layer")
    ax.set_ylabel("heads")
    integer_ticks(ax.xaxis)
    integer_ticks(ax.yaxis)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path, dpi=120)


def retrieval_trace(steps, rows, threshold: float, path: storage.PathLike, title: str):
    """QRscore of every FA head against the training step, the threshold dashed, a dot where
    each head first reaches it."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    layers = sorted({r["layer"] for r in rows})
    cmap = plt.get_cmap("viridis", max(len(layers), 2))
    for r in rows:
        color = cmap(layers.index(r["layer"]))
        ax.plot(
            steps,
            r["scores"],
            color=color,
            lw=1,
            alpha=0.8,
            label=f"layer {r['layer']}" if r["head"] == 0 else None,
        )
        if r["first_step"] is not None:
            ax.plot(
                r["first_step"],
                r["scores"][list(steps).index(r["first_step"])],
                "o",
                color=color,
                ms=4,
            )
    ax.axhline(threshold, color="tab:red", ls="--", lw=1, label=f"threshold {threshold:g}")
    ax.set_ylim(0, 1)
    if len(steps) <= 12:
        ax.set_xticks(list(steps))
    ax.set_title(title, fontsize=9)
    finish_line_chart(
        fig,
        ax,
        path,
        xlabel="training step (checkpoint)",
        ylabel="QRscore (mass on the needle)",
        legend_size=7,
    )
