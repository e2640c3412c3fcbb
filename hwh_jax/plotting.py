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
    close it. The canvas is cropped or grown to every artist's extent (``bbox_inches="tight"``)
    so that no label or title is cut off, whatever the layout left."""
    path = storage.path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as f:
        fig.savefig(
            f,
            dpi=dpi,
            format=path.suffix.lstrip(".") or "png",
            bbox_inches="tight",
            pad_inches=0.05,
        )
    pyplot().close(fig)


def integer_ticks(axis) -> None:
    """Ticks at whole numbers only (an axis that counts layers, heads or items)."""
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(integer=True))


def plain_log_ticks(axis) -> None:
    """A log axis labelled in plain numbers (150, 200), not 1.5x10^2."""
    from matplotlib.ticker import FuncFormatter

    plain = FuncFormatter(lambda v, _: f"{v:g}")
    axis.set_major_formatter(plain)
    axis.set_minor_formatter(plain)
