"""Run output a person can follow: a console line, metrics.jsonl, TensorBoard events, a plot."""
from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path

from hwh_jax.plotting import finish_line_chart, pyplot

log = logging.getLogger(__name__)


def format_duration(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


class MetricsWriter:
    """Appends JSON lines to ``metrics.jsonl`` and scalars to TensorBoard (tensorboardX)."""

    def __init__(self, workdir: Path, *, enabled: bool = True):
        self.enabled = enabled
        self.path = Path(workdir) / "metrics.jsonl"
        self.tb = None
        if enabled:
            try:
                from tensorboardX import SummaryWriter
                self.tb = SummaryWriter(str(Path(workdir) / "tensorboard"))
            except ImportError:
                log.warning("tensorboardX is not installed: no TensorBoard events")

    def write(self, step: int, split: str, values: dict) -> None:
        if not self.enabled:
            return
        row = {"step": int(step), "split": split, "time": time.time(),
               **{k: float(v) for k, v in values.items()}}
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        if self.tb is not None:
            for k, v in values.items():
                self.tb.add_scalar(f"{split}/{k}", float(v), int(step))
            self.tb.flush()

    def truncate(self, step: int) -> int:
        """Drop the rows after ``step`` (a run resuming there repeats them); returns how many."""
        if not self.enabled or not self.path.exists():
            return 0
        rows = self.path.read_text().splitlines()
        keep = [r for r in rows if r.strip() and json.loads(r)["step"] <= step]
        if len(keep) != len(rows):
            tmp = self.path.with_suffix(".jsonl.tmp")
            tmp.write_text("".join(r + "\n" for r in keep))
            tmp.replace(self.path)
        return len(rows) - len(keep)

    def close(self):
        if self.tb is not None:
            self.tb.close()


def progress_line(step: int, total: int, m: dict, tokens_per_s: float, mfu: float | None,
                  eta_s: float, data_share: float | None = None, plan: str = "") -> str:
    """One log line. ``data_share``: the fraction of the interval's wall time the loop spent
    waiting for its next batch (near 1: the host's input pipeline, not the device, sets the
    pace). ``plan``: the step's micro-batch x accumulation and memory a device."""
    mfu_s = f"{100 * mfu:.1f}%" if mfu is not None else "n/a"
    data_s = f" | data {100 * data_share:.0f}%" if data_share is not None else ""
    if plan:
        data_s += f" | {plan}"
    return (f"step {step:>6d}/{total} | loss {m['loss']:.4f} | lr {m['lr']:.2e} | "
            f"gnorm {m['grad_norm']:.3f} | {tokens_per_s / 1e3:.1f}k tok/s | MFU {mfu_s}{data_s} | "
            f"ETA {format_duration(eta_s)}")


def read_metrics(path: Path) -> list[dict]:
    if not Path(path).exists():
        return []
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def plot_loss(metrics_path: Path, out_png: Path, *, title: str = "",
              reference: dict[str, float] | None = None) -> Path:
    """Train and held-out loss against step; horizontal lines for reference levels."""
    plt = pyplot()
    rows = read_metrics(metrics_path)
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for split, style in (("train", "-"), ("heldout", "o-")):
        pts = [(r["step"], r["loss"]) for r in rows if r["split"] == split and "loss" in r]
        if pts:
            ax.plot(*zip(*pts), style, label=f"{split} loss", ms=3)
    for name, value in (reference or {}).items():
        if value is not None and math.isfinite(value):
            ax.axhline(value, ls="--", lw=1, color="gray")
            ax.text(ax.get_xlim()[0], value, f" {name} {value:.2f}", va="bottom", fontsize=8)
    ax.set_title(title)
    finish_line_chart(fig, ax, out_png, xlabel="step", ylabel="loss (nats / token)",
                      legend_size=10)
    return out_png
