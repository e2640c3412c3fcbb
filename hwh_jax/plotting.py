"""Shared matplotlib set-up for the project's figures (headless backend, one way to save)."""
from __future__ import annotations


def pyplot():
    """matplotlib.pyplot on the non-interactive Agg backend (no display needed)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def finish_line_chart(fig, ax, path, *, xlabel: str, ylabel: str, legend_size: int = 8):
    """Axis labels, legend, light grid, then save at 120 dpi and close the figure."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=legend_size)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    pyplot().close(fig)
