"""The workdir lease (``training.lease``): one trainer a workdir. Taken at once when free,
refused naming the holder while its heartbeat is fresh, taken over when stale or when its
process on this host is gone, lost by the slower of two racing starts; renewed by its
heartbeat and removed on release."""

import json
import logging
import os
import socket
import time

import pytest

from hwh_jax.training import lease


def test_a_held_lease_refuses_a_second_start_naming_the_holder(tmp_path):
    held = lease.acquire(tmp_path, settle=0.01)
    try:
        record = json.loads((tmp_path / lease.FILE).read_text())
        assert record["pid"] == os.getpid() and record["host"] == socket.gethostname()
        with pytest.raises(lease.WorkdirBusy) as e:
            lease.acquire(tmp_path, settle=0.01)
        message = str(e.value)
        assert "\n" not in message and f"pid {os.getpid()}" in message
        assert "last heartbeat 0 s ago" in message and str(tmp_path / lease.FILE) in message
    finally:
        held.release()
    assert not (tmp_path / lease.FILE).exists()
    lease.acquire(tmp_path, settle=0.01).release()  # free again


@pytest.fixture
def said():
    """The lease module's log lines (a handler on its own logger: what other tests' libraries
    do to the root logger does not matter)."""
    lines = []

    class Keep(logging.Handler):
        def emit(self, record):
            lines.append(record.getMessage())

    logger = logging.getLogger(lease.__name__)
    handler, was = Keep(level=logging.WARNING), (logger.disabled, logger.level)
    logger.disabled = False
    logger.setLevel(logging.WARNING)
    logger.addHandler(handler)
    yield lines
    logger.removeHandler(handler)
    logger.disabled, logger.level = was


def test_a_stale_lease_or_a_dead_holder_is_taken_over_with_a_line(tmp_path, said):
    old = time.time() - 600
    (tmp_path / lease.FILE).write_text(
        json.dumps({"host": "elsewhere", "pid": 1, "token": "x", "taken": old, "heartbeat": old})
    )
    lease.acquire(tmp_path, stale_after=120, settle=0.01).release()
    assert len(said) == 1 and "taking over the workdir lease of host elsewhere pid 1" in said[0]
    assert said[0].endswith("(stale)")
    # this host, a process that has ended: taken over at once, heartbeat fresh or not
    import subprocess
    import sys

    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    ).stdout.strip()
    now = time.time()
    (tmp_path / lease.FILE).write_text(
        json.dumps(
            {
                "host": socket.gethostname(),
                "pid": int(gone),
                "token": "y",
                "taken": now,
                "heartbeat": now,
            }
        )
    )
    lease.acquire(tmp_path, settle=0.01).release()
    assert len(said) == 2 and said[1].endswith("(its process is gone)")


def test_the_heartbeat_renews_and_a_lease_taken_away_is_not_removed(tmp_path):
    held = lease.acquire(tmp_path, stale_after=0.4, settle=0.01)
    first = json.loads((tmp_path / lease.FILE).read_text())["heartbeat"]
    time.sleep(0.35)
    assert json.loads((tmp_path / lease.FILE).read_text())["heartbeat"] > first
    other = {"host": "elsewhere", "pid": 2, "token": "z", "taken": 0, "heartbeat": time.time()}
    (tmp_path / lease.FILE).write_text(json.dumps(other))
    held.release()  # not ours any more: left to its holder
    assert json.loads((tmp_path / lease.FILE).read_text())["token"] == "z"


def test_of_two_racing_starts_one_refuses(tmp_path, monkeypatch):
    """Another start writes its lease inside this start's settle window (a bucket, where no
    exclusive create exists): the token read back is not ours, so this start refuses."""
    monkeypatch.setattr(lease.storage, "is_remote", lambda p: True)
    real_sleep = time.sleep

    def racing(seconds):
        (tmp_path / lease.FILE).write_text(
            json.dumps(
                {
                    "host": "racer",
                    "pid": 3,
                    "token": "r",
                    "taken": time.time(),
                    "heartbeat": time.time(),
                }
            )
        )
        real_sleep(seconds)

    monkeypatch.setattr(lease.time, "sleep", racing)
    with pytest.raises(lease.WorkdirBusy, match="taken by another run starting at the same time"):
        lease.acquire(tmp_path, settle=0.01)
