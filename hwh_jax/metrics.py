"""Run output a person can follow: a console line, metrics.jsonl, TensorBoard events, a plot."""

from __future__ import annotations

import json
import logging
import math
import time

from hwh_jax import storage
from hwh_jax.plotting import finish_line_chart, pyplot

log = logging.getLogger(__name__)


def format_duration(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


class MetricsWriter:
    """Appends JSON lines to ``<workdir>/metrics.jsonl`` and scalars to the run's loggers
    (``hwh_jax.loggers``: TensorBoard, W&B). On a local disk each row is appended at once; in a
    bucket (no appending there) the rows are kept and the whole object rewritten by ``flush``
    (at log points, checkpoints and close) and at most every ``FLUSH_S`` seconds."""

    FLUSH_S = 30.0

    def __init__(self, workdir, *, enabled: bool = True, loggers=()):
        self.enabled = enabled
        self.path = storage.path(workdir) / "metrics.jsonl"
        self.remote = storage.is_remote(self.path)
        self.loggers = list(loggers) if enabled else []
        self._rows: list[str] | None = None  # a bucket's rows, read on first use
        self._dirty, self._flushed = False, time.time()

    def _remote_rows(self) -> list[str]:
        if self._rows is None:
            self._rows = self.path.read_text().splitlines() if self.path.exists() else []
        return self._rows

    def write(self, step: int, split: str, values: dict) -> None:
        if not self.enabled:
            return
        row = {
            "step": int(step),
            "split": split,
            "time": time.time(),
            **{k: float(v) for k, v in values.items()},
        }
        line = json.dumps(row)
        if self.remote:
            self._remote_rows().append(line)
            self._dirty = True
            if time.time() - self._flushed > self.FLUSH_S:
                self.flush()
        else:
            with self.path.open("a") as f:
                f.write(line + "\n")
        for logger in self.loggers:
            logger.scalars(int(step), {f"{split}/{k}": float(v) for k, v in values.items()})
            if not self.remote:
                logger.flush()  # a local TensorBoard shows each point at once

    def flush(self) -> None:
        """Bring the bucket's metrics.jsonl and the loggers up to date."""
        if self.remote and self._dirty:
            storage.write_text(self.path, "".join(r + "\n" for r in self._remote_rows()))
            self._dirty = False
        self._flushed = time.time()
        for logger in self.loggers:
            logger.flush()

    def truncate(self, step: int) -> int:
        """Drop the rows after ``step`` (a run resuming there repeats them); returns how many."""
        if not self.enabled or not self.path.exists():
            return 0
        rows = self._remote_rows() if self.remote else self.path.read_text().splitlines()
        keep = [r for r in rows if r.strip() and json.loads(r)["step"] <= step]
        if len(keep) != len(rows):
            storage.write_text(self.path, "".join(r + "\n" for r in keep))
            if self.remote:
                self._rows = keep
        return len(rows) - len(keep)

    def close(self):
        if not self.enabled:
            return
        self.flush()
        for logger in self.loggers:
            logger.close()


def progress_line(
    step: int,
    total: int,
    m: dict,
    tokens_per_s: float,
    mfu: float | None,
    eta_s: float,
    data_share: float | None = None,
    plan: str = "",
) -> str:
    """One log line. ``data_share``: the fraction of the interval's wall time the loop spent
    waiting for its next batch (near 1: the host's input pipeline, not the device, sets the
    pace). ``plan``: the step's micro-batch x accumulation and memory a device."""
    mfu_s = f"{100 * mfu:.1f}%" if mfu is not None else "n/a"
    data_s = f" | data {100 * data_share:.0f}%" if data_share is not None else ""
    if plan:
        data_s += f" | {plan}"
    return (
        f"step {step:>6d}/{total} | loss {m['loss']:.4f} | lr {m['lr']:.2e} | "
        f"gnorm {m['grad_norm']:.3f} | {tokens_per_s / 1e3:.1f}k tok/s | MFU {mfu_s}{data_s} | "
        f"ETA {format_duration(eta_s)}"
    )


def read_metrics(path) -> list[dict]:
    path = storage.path(path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def plot_loss(metrics_path, out_png, *, title: str = "", reference: dict[str, float] | None = None):
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
    finish_line_chart(fig, ax, out_png, xlabel="step", ylabel="loss (nats / token)", legend_size=10)
    return out_png
