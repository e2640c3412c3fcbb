"""Human-readable summaries of a ModelConfig: parameter counts and the per-layer allocation."""

from __future__ import annotations

import numpy as np

from hwh_jax.layers.config import ModelConfig
from hwh_jax.models.params import param_table
from hwh_jax.models.variants import ARCHS, SIZES, model_config
from hwh_jax.plotting import pyplot, save_figure


def describe(cfg: ModelConfig) -> str:
    p = param_table(cfg)
    lines = [
        f"arch {cfg.arch}: d={cfg.d_model} L={cfg.num_layers} H={cfg.num_heads} "
        f"D={cfg.head_dim} K={cfg.la_key_dim} V={cfg.la_value_dim} mlp={cfg.mlp_hidden} "
        f"vocab={cfg.vocab_size} dtype={cfg.dtype}",
        f"params: total {p['total']:,} (embedding {p['embedding']:,}, mixers {p['mixers']:,}, "
        f"MLPs {p['mlps']:,}, norms {p['norms']:,})",
        f"FA share {cfg.fa_share:.4f} ({sum(cfg.fa_heads)} FA / {sum(cfg.la_heads)} LA heads"
        f"{f', linear heads {cfg.la_kind}' if sum(cfg.la_heads) else ''})",
        " layer  FA  LA  FA-pos  window",
    ]
    for l, s in enumerate(cfg.layers):
        pos = ("RoPE" if s.fa_rope else "NoPE") if s.num_fa else "-"
        lines.append(f" {l:5d} {s.num_fa:3d} {s.num_la:3d}  {pos:6s}  {s.window or '-'}")
    return "\n".join(lines)


def markdown_table(sizes=tuple(SIZES), archs=ARCHS) -> str:
    """The docs/models.md table: every architecture x size."""
    rows = [
        "| size | arch | params | vs transformer | mlp hidden | FA share | FA heads per layer |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for size in sizes:
        base = param_table(model_config("transformer", size))["total"]
        for arch in archs:
            cfg = model_config(arch, size)
            total = param_table(cfg)["total"]
            rows.append(
                f"| {size} | {arch} | {total / 1e6:.2f}M | {100 * (total / base - 1):+.2f}% "
                f"| {cfg.mlp_hidden} | {cfg.fa_share:.3f} | "
                f"{','.join(map(str, cfg.fa_heads))} |"
            )
    return "\n".join(rows)


def plot_allocation(configs: dict, path) -> None:
    """One panel per ``{name: ModelConfig}``: layers (rows, first at the top) x head slots, each
    head coloured by kind (FA with RoPE, FA without position encoding, sliding-window FA,
    Gated DeltaNet)."""
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    kinds = [
        ("GDN head", "#d9e6f2"),
        ("FA, NoPE", "#c0392b"),
        ("FA, RoPE", "#f0a030"),
        ("FA, sliding window", "#8e7cc3"),
    ]
    plt = pyplot()
    fig, axes = plt.subplots(
        1, len(configs), figsize=(2.6 * len(configs) + 0.4, 4.6), squeeze=False
    )
    for ax, (name, cfg) in zip(axes[0], configs.items()):
        width = max(s.num_fa + s.num_la for s in cfg.layers)
        grid = np.zeros((cfg.num_layers, width))
        for l, s in enumerate(cfg.layers):
            kind = 3 if s.window else 2 if s.fa_rope else 1
            grid[l, : s.num_fa] = kind
        ax.imshow(
            grid,
            cmap=ListedColormap([c for _, c in kinds]),
            vmin=0,
            vmax=3,
            aspect="auto",
            interpolation="nearest",
        )
        ax.set_xticks([])
        ax.set_yticks(range(0, cfg.num_layers, 4))
        ax.set_title(f"{name}\nFA share {cfg.fa_share:.2f}", fontsize=9)
        ax.set_xlabel(f"{width} heads a layer", fontsize=8)
    axes[0][0].set_ylabel("layer")
    fig.legend(
        handles=[Patch(color=c, label=k) for k, c in kinds],
        loc="lower center",
        ncol=len(kinds),
        fontsize=8,
        frameon=False,
    )
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    save_figure(fig, path, dpi=120)
