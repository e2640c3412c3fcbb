"""Stopping a long loop cleanly: SIGTERM / SIGINT set a flag the loop reads between steps, so it
can save what it has and return (a scheduler's preemption, ``timeout``, Ctrl-C)."""

from __future__ import annotations

import logging
import signal

log = logging.getLogger(__name__)


class StopOnSignal:
    """Within ``with StopOnSignal() as stop:``, SIGTERM and SIGINT set ``stop.signal`` to the
    signal's name instead of ending the process; the old handlers return on exit. Outside the
    main thread (where signals cannot be caught) it only holds ``signal = None``."""

    def __init__(self, what: str = "saving and stopping"):
        self.signal = None
        self.what = what
        self._old = {}

    def __enter__(self):
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                self._old[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread: signals cannot be caught here
                pass
        return self

    def _handle(self, signum, frame):
        self.signal = signal.Signals(signum).name
        log.warning("received %s: %s", self.signal, self.what)

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)
