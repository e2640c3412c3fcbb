"""hwh_jax.progress: log lines off a terminal (count, rate, time left, at most one an interval),
a tqdm bar on one."""

import io
import logging

from hwh_jax import progress
from hwh_jax.progress import Progress


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_off_a_terminal_a_line_an_interval_with_rate_and_time_left(caplog):
    clock = Clock()
    with caplog.at_level(logging.INFO, logger=progress.__name__):
        p = Progress(1000, "hellaswag", unit="request", every_s=30, bar=False, clock=clock)
        for _ in range(10):  # 100 requests a 10 s: a line at 30 s and at 60 s
            clock.t += 10
            p.update(100)
        p.close()
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == "hellaswag: 300/1,000 requests, 10.0/s, 1m10s left"
    assert lines[1] == "hellaswag: 600/1,000 requests, 10.0/s, 40s left"
    assert lines[-1] == "hellaswag: 1,000/1,000 requests, 10.0/s, done in 1m40s"
    assert len(lines) == 4  # 30, 60, 90 s, and the close


def test_a_short_task_says_nothing(caplog):
    clock = Clock()
    with caplog.at_level(logging.INFO, logger=progress.__name__):
        with Progress(4, "mqar", bar=False, clock=clock) as p:
            clock.t += 5
            p.to(4)
    assert not caplog.records


def test_on_a_terminal_a_bar(monkeypatch):
    err = io.StringIO()
    monkeypatch.setattr(progress.sys, "stderr", err)
    with Progress(3, "niah", unit="prompt", bar=True) as p:
        p.update(3)
    assert "niah:" in err.getvalue() and "/3 [" in err.getvalue()  # drawn, then cleared
