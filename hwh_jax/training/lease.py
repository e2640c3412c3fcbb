"""One trainer a workdir: a lease file, ``<workdir>/lease.json``, that a run takes before it
writes anything and renews while it trains.

The lease holds the holder's host, process id, a random token, when it was taken and its last
heartbeat. A start that finds a lease whose heartbeat is younger than ``stale_after`` seconds
refuses with one line naming the holder; an older lease, or one of this host whose process is
gone, is taken over with a line saying whose it was. Taking is write, wait, read back: of two
starts racing for a free workdir, the one whose token is not read back refuses. The heartbeat
rewrites the file every ``stale_after / 4`` seconds from a thread; ``release`` removes it
(a run that ends in any way, a SIGTERM stop included). It works wherever ``storage`` writes
(a local disk: renamed into place; a bucket: one object rewritten whole), without locks the
file system or the store would have to provide, at the price of the ``settle`` wait.

A job of several processes: process 0 holds the lease for all (``trainer``); a killed job's
lease goes stale after ``stale_after`` (``train.lease_seconds``, default 120 s), sooner on the
same host.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import threading
import time

from hwh_jax import storage

log = logging.getLogger(__name__)
FILE = "lease.json"


class WorkdirBusy(ValueError):
    """Another run holds the workdir's lease."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def _read(path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (json.JSONDecodeError, UnicodeDecodeError):
        return {}  # half-written or damaged: nobody's


class Lease:
    """A held lease (``acquire``); ``release()`` ends it."""

    def __init__(self, path, record: dict, interval: float):
        self.path, self.record = path, record
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._beat, args=(interval,), daemon=True, name="workdir-lease"
        )
        self._thread.start()

    def _beat(self, interval: float):
        while not self._stop.wait(interval):
            try:
                now = _read(self.path)
                if now and now.get("token") != self.record["token"]:
                    log.error(
                        "the workdir lease %s was taken by host %s pid %s while this run held it",
                        self.path,
                        now.get("host"),
                        now.get("pid"),
                    )
                    return
                self.record["heartbeat"] = time.time()
                storage.write_text(self.path, json.dumps(self.record))
            except OSError as e:  # a storage hiccup: the next beat tries again
                log.warning("could not renew the workdir lease %s: %s", self.path, e)

    def release(self):
        self._stop.set()
        self._thread.join(timeout=5)
        try:
            now = _read(self.path)
            if now is not None and now.get("token") == self.record["token"]:
                self.path.unlink()
        except OSError as e:
            log.warning("could not remove the workdir lease %s: %s", self.path, e)


def describe(record: dict, now: float) -> str:
    age = now - record.get("heartbeat", 0)
    return (
        f"host {record.get('host', '?')} pid {record.get('pid', '?')}, taken "
        f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(record.get('taken', 0)))}, "
        f"last heartbeat {age:.0f} s ago"
    )


def _create_local(path, record: dict) -> bool:
    """Create a local lease file only if none exists (O_EXCL: race-free on one file system)."""
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(record))
    return True


def acquire(workdir, *, stale_after: float = 120.0, settle: float = 1.0) -> Lease:
    """Take ``workdir``'s lease or raise WorkdirBusy naming its holder (module docstring). A
    free local workdir is taken at once (an exclusive create); a bucket's, or a stale lease,
    by write, ``settle`` seconds' wait and read back."""
    path = storage.path(workdir) / FILE
    host, pid = socket.gethostname(), os.getpid()
    now = time.time()
    record = {
        "host": host,
        "pid": pid,
        "token": secrets.token_hex(8),
        "taken": now,
        "heartbeat": now,
    }
    if not storage.is_remote(path) and _create_local(path, record):
        return Lease(path, record, interval=stale_after / 4)
    held = _read(path)
    if held:
        same_host_dead = held.get("host") == host and not _alive(int(held.get("pid", -1)))
        fresh = now - held.get("heartbeat", 0) < stale_after
        if fresh and not same_host_dead:
            raise WorkdirBusy(
                f"workdir {workdir} is in use by another run ({describe(held, now)}): two "
                f"trainers would interleave their metrics and checkpoints. Wait for it to end, "
                f"use another --workdir, or, if that run is dead, remove {path} (a lease "
                f"without heartbeat is taken over {stale_after:.0f} s after its last one)"
            )
        log.warning(
            "taking over the workdir lease of %s (%s)",
            describe(held, now),
            "its process is gone" if same_host_dead else "stale",
        )
    storage.write_text(path, json.dumps(record))
    time.sleep(settle)  # a racing start writes in this window
    back = _read(path)
    if not back or back.get("token") != record["token"]:
        raise WorkdirBusy(
            f"workdir {workdir} was taken by another run starting at the same "
            f"time ({describe(back or {}, time.time())}); use another --workdir"
        )
    return Lease(path, record, interval=stale_after / 4)
