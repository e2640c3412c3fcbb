"""A job of several processes notices a dead peer in bounded time and ends with one line.

Without this, a process whose peer was killed waits in its next collective until the
coordination service's heartbeat timeout (``jax.distributed``'s 100 s) and then aborts with
a native stack trace. ``watch`` starts a thread in each process that bumps a counter of its
own in the coordination service's key-value store every ``interval`` seconds and reads the
others'. A peer whose counter has not moved for ``timeout`` seconds (by this process's clock:
no clock is compared across hosts), or a store that cannot be reached (the coordinator,
process 0, is gone), ends this process at once: one line on stderr naming the process and
what stays, exit status 1. A dead peer is thus reported within ``timeout + interval``
seconds: 60 + 5 by default (``HWH_PEER_TIMEOUT_S`` changes the 60; long enough that a
process busy compiling, whose thread still runs, is never taken for dead).
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
import time

_log = logging.getLogger("launch")
EXIT_PEER_LOST = 1


def _end(line: str) -> None:
    _log.error("%s", line)
    print(f"error: {line}", file=sys.stderr, flush=True)
    logging.shutdown()
    os._exit(EXIT_PEER_LOST)


def watch(
    client, index: int, count: int, *, interval: float = 5.0, timeout: float | None = None, end=_end
) -> threading.Thread:
    """Start the watch of the module docstring for process ``index`` of ``count``;
    ``client``: ``jax.distributed``'s coordination client."""
    timeout = float(os.environ.get("HWH_PEER_TIMEOUT_S", 60)) if timeout is None else timeout
    key = "hwh_jax/alive/{}".format
    # At exit the processes leave at different moments and the coordinator takes the store
    # down: from then on (atexit runs this before jax.distributed's own shutdown, registered
    # earlier) the watch judges no one and only keeps beating, so that a process still
    # finishing its run is not taken for dead by one waiting at the shutdown barrier; a store
    # gone then ends the thread quietly.
    stopped = threading.Event()
    atexit.register(stopped.set)

    def end_unless_stopped(line):
        if not stopped.is_set():
            end(line)

    def run():
        seen = {j: (None, time.monotonic()) for j in range(count) if j != index}
        beat = 0
        while True:
            beat += 1
            try:
                client.key_value_set(key(index), str(beat), allow_overwrite=True)
                values = {j: _get(client, key(j)) for j in seen}
            except Exception as e:  # noqa: BLE001 - any failure of the store: the coordinator
                first = str(e).splitlines()[0][:120] if str(e) else ""
                end_unless_stopped(
                    f"the job's coordinator (process 0) cannot be reached ({type(e).__name__}: "
                    f"{first}); ending process {index}: the job cannot go on without it. The "
                    f"checkpoints in the workdir stay; relaunch every process to resume from "
                    f"the newest"
                )
                return
            now = time.monotonic()
            for j, value in values.items():
                last, since = seen[j]
                if value != last:
                    seen[j] = (value, now)
                elif value is not None and now - since > timeout and not stopped.is_set():
                    end(
                        f"process {j} of the job stopped answering (no heartbeat for "
                        f"{now - since:.0f} s); ending process {index}: the job cannot go on "
                        f"without it. The checkpoints in the workdir stay; relaunch every "
                        f"process to resume from the newest"
                    )
                    return
            time.sleep(interval)

    thread = threading.Thread(target=run, daemon=True, name="hwh-peer-watch")
    thread.start()
    return thread


def _get(client, key: str) -> str | None:
    """``key``'s value, or None before its process first wrote it (jaxlib raises its own
    NOT_FOUND error then)."""
    try:
        return client.key_value_try_get(key)
    except Exception as e:  # jaxlib's error type is not exported
        if "NOT_FOUND" in str(e) or "not found" in str(e).lower():
            return None
        raise
