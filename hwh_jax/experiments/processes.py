"""Child processes of one command, several at a time: the seeds of ``launch.experiment`` and the
cells of ``launch.mqar`` sharing one GPU.

Each job is a command line with a console log of its own. At most ``at_once`` run together; a
finished job's exit status and last console line are printed as it ends. SIGTERM or SIGINT to
the parent reaches every running child (each saves and stops as its own command does) and
starts no new one: the parent then waits for them and reports the jobs that did not finish.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path


def run_side_by_side(
    jobs: list[tuple[str, list[str], Path]], at_once: int, env: dict | None = None
) -> tuple[list[str], bool]:
    """Run ``jobs`` (name, argv, console log path), ``at_once`` at a time. Returns (the names
    of the jobs that failed or never started, whether a signal stopped the run)."""
    if at_once < 1:
        raise ValueError(f"--side_by_side must be >= 1, got {at_once}")
    waiting, running, failed = list(jobs), {}, []
    stopped = []

    def forward(signum, frame):
        del frame
        stopped.append(signum)
        for proc, _ in running.values():
            if proc.poll() is None:
                proc.send_signal(signum)

    old = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    t0 = time.time()
    try:
        while running or (waiting and not stopped):
            while waiting and not stopped and len(running) < at_once:
                name, argv, console = waiting.pop(0)
                Path(console).parent.mkdir(parents=True, exist_ok=True)  # local path: consoles
                log = open(console, "a")  # a continued run's console follows on
                running[name] = (
                    subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env),
                    log,
                )
                print(f"{name}: started (console: {console})", flush=True)
            time.sleep(0.5)
            for name, (proc, log) in list(running.items()):
                if proc.poll() is None:
                    continue
                log.close()
                del running[name]
                lines = Path(log.name).read_text().strip().splitlines()[-1:] or [""]  # local path
                print(
                    f"{name}: exit {proc.returncode} after {time.time() - t0:.0f}s: {lines[0]}",
                    flush=True,
                )
                if proc.returncode:
                    failed.append(name)
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
    return failed + [name for name, _, _ in waiting], bool(stopped)


def argv_without(argv: list[str], names: tuple[str, ...]) -> list[str]:
    """argv less the flags ``names`` (as --name=value or --name value): a child's command line
    from the parent's."""
    kept, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        name = a.lstrip("-").split("=")[0]
        if a.startswith("-") and name in names:
            skip = "=" not in a
            continue
        kept.append(a)
    return kept
