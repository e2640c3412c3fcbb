"""Shared matplotlib set-up for the project's figures (headless backend, one way to save)."""
from __future__ import annotations

from hwh_jax import storage


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
    save_figure(fig, path, dpi=120)


def save_figure(fig, path, *, dpi: int = 120) -> None:
    """Save ``fig`` to ``path`` (a local file or a bucket URL; the format from its suffix) and
    close it."""
    path = storage.path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as f:
        fig.savefig(f, dpi=dpi, format=path.suffix.lstrip(".") or "png")
    pyplot().close(fig)
