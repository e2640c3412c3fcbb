"""Progress of a long loop (an evaluation task, the analysis' samples): a tqdm bar on a
terminal; elsewhere (a log file, CI, a batch job's output) one INFO line every ``every_s``
seconds (10) and one at the end, each with the count, the rate and the time left, since a bar's
carriage returns make an unreadable log.

    with Progress(len(requests), "hellaswag", unit="request") as p:
        for batch in ...:
            ...
            p.update(len(batch))
"""

from __future__ import annotations

import logging
import sys
import time

log = logging.getLogger(__name__)


def _terminal() -> bool:
    return hasattr(sys.stderr, "isatty") and sys.stderr.isatty()


def _duration(s: float) -> str:
    s = int(round(s))
    return (
        f"{s // 3600}h{s % 3600 // 60:02d}m"
        if s >= 3600
        else (f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s")
    )


class Progress:
    """Counts work done out of ``total`` (``update(n)`` adds, ``to(done)`` sets). ``bar``:
    None picks a tqdm bar when stderr is a terminal, log lines otherwise."""

    def __init__(
        self,
        total: int,
        desc: str,
        *,
        unit: str = "item",
        every_s: float = 10.0,
        bar: bool | None = None,
        clock=time.monotonic,
    ):
        self.total, self.desc, self.unit, self.every_s = int(total), desc, unit, every_s
        self.done, self._clock = 0, clock
        self._start = self._last = clock()
        self._bar = None
        if _terminal() if bar is None else bar:
            from tqdm.auto import tqdm

            self._bar = tqdm(
                total=self.total,
                desc=desc,
                unit=unit,
                file=sys.stderr,
                dynamic_ncols=True,
                leave=False,
            )

    def update(self, n: int = 1) -> None:
        self.to(self.done + n)

    def to(self, done: int) -> None:
        step, self.done = done - self.done, done
        if self._bar is not None:
            self._bar.update(step)
            return
        now = self._clock()
        if now - self._last >= self.every_s and self.done < self.total:
            self._last = now
            log.info("%s", self.line())

    def line(self) -> str:
        """``desc: done/total units, rate/s, ETA`` (the log form of the bar)."""
        spent = max(self._clock() - self._start, 1e-9)
        rate = self.done / spent
        text = f"{self.desc}: {self.done:,}/{self.total:,} {self.unit}s, {rate:,.1f}/s"
        if self.done >= self.total:
            return text + f", done in {_duration(spent)}"
        left = (self.total - self.done) / rate if rate > 0 else float("inf")
        return text + (f", {_duration(left)} left" if left != float("inf") else "")

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        elif self._clock() - self._start >= self.every_s:  # a short task: its result says it
            log.info("%s", self.line())

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
