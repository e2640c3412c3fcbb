"""Where a jitted step's device time goes: capture a JAX profiler trace, sum it by kernel.

    with capture(out_dir):                     # jax.profiler.trace with a Perfetto JSON trace
        for _ in range(n): run_one_step()
    summary = summarize(out_dir, steps=n)      # device time per step, by category and by kernel

The trace's device events (processes named ``/device:...``, one thread per stream) are summed
per kernel name and grouped into categories by name (``CATEGORIES``: the GDN Pallas kernels by
their ``gdn_`` names, attention, matmuls, copies, the rest as fusions). ``busy_ms`` is the union
of the kernels' intervals per step: beside the step's wall time it tells how much of the step
the device was idle (launch gaps, host work). On the CPU backend there are no device events:
the summary is empty.
"""
from __future__ import annotations

import contextlib
import gzip
import json
import re
from pathlib import Path

import jax

# (category, pattern on the lower-cased kernel name), first match wins.
CATEGORIES = (
    ("gdn", r"gdn_"),
    ("attention", r"cudnn|fmha|flash|attention|splash"),
    ("matmul", r"gemm|nvjet|cutlass|cublas|xmma|wgmma|dot|matmul"),
    ("copy", r"memcpy|memset|copy"),
)


def category(name: str) -> str:
    low = name.lower()
    for cat, pattern in CATEGORIES:
        if re.search(pattern, low):
            return cat
    return "fusion/other"


@contextlib.contextmanager
def capture(out_dir: str | Path):
    """jax.profiler.trace into ``out_dir`` (created), with the Perfetto JSON trace that
    ``summarize`` reads."""
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    with jax.profiler.trace(str(out_dir), create_perfetto_trace=True):
        yield


def _trace_file(out_dir: Path) -> Path:
    found = sorted(Path(out_dir).glob("**/perfetto_trace.json.gz"))
    if not found:
        raise FileNotFoundError(f"no perfetto_trace.json.gz under {out_dir}: capture() first")
    return found[-1]


def _union_ms(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for s, e in sorted(intervals):
        if e > end:
            total += e - max(s, end)
            end = e
    return total / 1e3


def summarize(out_dir: str | Path, steps: int, top: int = 20) -> dict:
    """Device time per step (ms): total kernel time, busy (union of intervals), by category and
    the ``top`` kernels, from the latest trace under ``out_dir``."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    data = json.loads(gzip.open(_trace_file(Path(out_dir))).read())
    events = data["traceEvents"] if isinstance(data, dict) else data
    device_pids = {e["pid"] for e in events if e.get("ph") == "M" and e.get("name") ==
                   "process_name" and str(e.get("args", {}).get("name", "")).startswith("/device:")}
    kernels: dict[str, float] = {}
    intervals = []
    for e in events:
        if e.get("ph") != "X" or e.get("pid") not in device_pids or "dur" not in e:
            continue
        kernels[e["name"]] = kernels.get(e["name"], 0.0) + e["dur"] / 1e3
        intervals.append((float(e["ts"]), float(e["ts"]) + float(e["dur"])))
    cats: dict[str, float] = {}
    for name, ms in kernels.items():
        c = category(name)
        cats[c] = cats.get(c, 0.0) + ms
    ranked = sorted(kernels.items(), key=lambda kv: -kv[1])
    return {"steps": steps,
            "kernel_ms": sum(kernels.values()) / steps,
            "busy_ms": _union_ms(intervals) / steps,
            "by_category_ms": {c: ms / steps
                               for c, ms in sorted(cats.items(), key=lambda kv: -kv[1])},
            "top_kernels_ms": [{"name": n, "category": category(n), "ms": ms / steps}
                               for n, ms in ranked[:top]]}


def format_summary(s: dict, step_ms: float | None = None) -> str:
    """A few lines for a log: busy vs the step's wall time, categories, the top kernels."""
    if not s["top_kernels_ms"]:
        return "device per step: no device events in the trace (the CPU backend has none)"
    head = f"device per step: kernels {s['kernel_ms']:.2f} ms, busy {s['busy_ms']:.2f} ms"
    if step_ms:
        head += f" of a {step_ms:.2f} ms step ({s['busy_ms'] / step_ms:.0%} busy)"
    lines = [head, "  " + ", ".join(f"{c} {ms:.2f}" for c, ms in s["by_category_ms"].items())]
    lines += [f"  {k['ms']:8.3f} ms  {k['category']:12s} {k['name'][:90]}"
              for k in s["top_kernels_ms"]]
    return "\n".join(lines)
