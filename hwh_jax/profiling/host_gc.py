"""Python's cyclic garbage collector beside a training loop: freeze what setup built, time pauses.

A jitted step's call returns while the device still has the step's last kernels queued (CUDA's
launch queue holds about a thousand), so the host is only tens of milliseconds ahead of the
device; any host pause longer than that leaves the device idle. Python's full collection
(generation 2) walks every object the process holds, and after setup that is jax's and flax's
modules, traced programs and compile caches: docs/benchmarks.md measures what such a pause
costs a training step.

    freeze()            # after the step is compiled: later collections skip everything alive now
    with GcPauses() as pauses:
        ... run steps ...
    pauses.events       # [(generation, ms), ...] of every collection inside the block

``freeze`` runs one full collection, then moves every live object into the permanent generation
(``gc.freeze``), which later collections do not walk; what the loop allocates afterwards is
collected as before, so nothing accumulates. A frozen object that becomes unreachable is still
freed by its reference count, but a frozen reference cycle is not until ``unfreeze`` (the trainer
calls it when its loop ends, so a process that runs several trainings does not keep each one's).
"""

from __future__ import annotations

import gc
import time


def freeze() -> int:
    """One full collection, then everything alive into the permanent generation; returns how
    many objects were frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def unfreeze():
    """Everything frozen back into the oldest generation, collectable again."""
    gc.unfreeze()


class GcPauses:
    """Records the generation and duration (ms) of each collection while the block runs."""

    def __init__(self):
        self.events: list[tuple[int, float]] = []
        self._t0 = None

    def _callback(self, phase, info):
        if phase == "start":
            self._t0 = time.perf_counter()
        elif self._t0 is not None:
            self.events.append((info["generation"], 1e3 * (time.perf_counter() - self._t0)))
            self._t0 = None

    def __enter__(self):
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc):
        gc.callbacks.remove(self._callback)

    def summary(self) -> dict:
        """Collections per generation and their total and longest pause (ms)."""
        out = {}
        for gen, ms in self.events:
            s = out.setdefault(f"gen{gen}", {"count": 0, "total_ms": 0.0, "max_ms": 0.0})
            s["count"] += 1
            s["total_ms"] = round(s["total_ms"] + ms, 3)
            s["max_ms"] = round(max(s["max_ms"], ms), 3)
        return out
