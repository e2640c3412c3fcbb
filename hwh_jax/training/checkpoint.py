"""Orbax checkpoints of the train state, the data iterator's state and the run's metadata, each
proving itself when restored.

The workdir may be a local folder or a bucket URL (``hwh_jax.storage``; Orbax writes the
arrays through TensorStore, the rest through ``etils.epath``). Saves are asynchronous by default:
``save`` returns once the state is copied off the devices (and its fingerprint computed), the
files are written on a background thread while training goes on, and the next ``save``,
``wait`` or ``close`` waits for them. A save is committed only once complete (Orbax writes
under a temporary name and finalises it), so a crash mid-save never leaves a checkpoint that a
restore would choose.

Layout under ``<workdir>/checkpoints/<step>/``: ``state`` (params, optimizer state, step, rng;
sharded arrays, restorable onto any mesh), ``data`` (Grain iterator state, JSON) and ``meta``
(JSON: config, step, the run's wall time so far and the state's ``fingerprint``).

The fingerprint is, per array of the state, a 32-bit sum of its elements' bits, each multiplied
by an odd hash of the element's position, computed on the devices at save (modular sums do not
depend on the order of summation, so the value is the same on any mesh). Any single changed bit
changes it. Restore walks back from the newest step and tries each in turn:

- a step that cannot be read is moved aside (``<step>.unreadable.<time>``);
- a step whose restored state does not match its fingerprint, or whose data position or
  metadata do not match the digests ``meta`` keeps of them (SHA-256 of their JSON; the meta's
  own digest covers the fingerprint and the data's digest), is moved aside
  (``<step>.corrupt.<time>``);
- a step marked suspect (``<step>.suspect``: a run that continued from it met a non-finite loss)
  is skipped; delete the marker to use it again;

each with one log line (the library's traceback goes to the debug log), and the next older step
is tried.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import re
import time

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from hwh_jax import storage

log = logging.getLogger(__name__)
_GOLDEN = np.uint32(2654435761)  # Knuth's multiplicative hash constant (odd)


class CheckpointWriteError(RuntimeError):
    """A checkpoint could not be written (disk full, read-only, ...): the previous one stays."""


def _bits(x):
    """x's elements as uint32 words (narrow types widened, 8-byte types as two words)."""
    if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
        x = jax.random.key_data(x)
    if x.dtype == jnp.bool_:
        x = x.astype(jnp.uint8)
    width = x.dtype.itemsize
    unsigned = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32}
    if width in unsigned:
        return jax.lax.bitcast_convert_type(x, unsigned[width]).astype(jnp.uint32)
    return jax.lax.bitcast_convert_type(x, jnp.uint32)


@jax.jit
def _fingerprints(leaves):
    out = []
    for x in leaves:
        words = _bits(x).reshape(-1)
        weight = jnp.arange(words.size, dtype=jnp.uint32) * _GOLDEN | jnp.uint32(1)
        out.append(jnp.sum(words * weight, dtype=jnp.uint32))
    return out


def fingerprint(state) -> dict[str, int]:
    """{path of each array: its 32-bit fingerprint} of a state tree (see the module docstring)."""
    paths, leaves = zip(*jax.tree_util.tree_flatten_with_path(state)[0])
    values = _fingerprints(list(leaves))  # replicated scalars: any local copy is the value
    return {
        jax.tree_util.keystr(p): int(np.asarray(v.addressable_data(0)))
        for p, v in zip(paths, values)
    }


class Checkpointer:
    """The run's checkpoints under ``<workdir>/checkpoints``: ``save`` (asynchronous unless
    ``asynchronous=False``, with the state's fingerprint), ``wait``, ``restore`` of the newest
    step that proves itself (module docstring), and ``mark_suspect``."""

    def __init__(self, workdir, *, keep: int = 3, writer: bool = True, asynchronous: bool = True):
        """``writer``: the training run's own (it clears the temporary folders a save cut off
        by a crash left); False for readers (eval, generate), which must leave a running
        training's writes alone."""
        self.directory = storage.absolute(workdir) / "checkpoints"
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep,
            create=writer,
            enable_async_checkpointing=asynchronous,
            cleanup_tmp_directories=writer,
        )
        self.manager = ocp.CheckpointManager(
            self.directory, options=options, item_names=("state", "data", "meta")
        )
        self.in_flight: int | None = None  # the step an asynchronous save is writing

    def save(self, step: int, state, data_state: dict, meta: dict) -> bool:
        """Start writing the checkpoint of ``step`` (waiting first for the previous save);
        False (nothing written) if it exists already. ``CheckpointWriteError`` names the OS's
        reason when a write fails (this one's, or the previous asynchronous one's)."""
        self.wait()
        if step in self.steps():
            if not self.suspect(step).exists():
                return False
            self._set_aside(
                step,
                "replaced",
                "marked suspect by an earlier run; this run reached the step again",
                level=logging.WARNING,
                then="writing this run's",
            )
            self.suspect(step).unlink()
        meta = {**meta, "fingerprint": fingerprint(state), "data_digest": digest(data_state)}
        meta["meta_digest"] = digest(meta)
        with self._write_errors(step):
            self.manager.save(
                step,
                args=ocp.args.Composite(
                    state=ocp.args.StandardSave(state),
                    data=ocp.args.JsonSave(dict(data_state)),
                    meta=ocp.args.JsonSave(meta),
                ),
                force=True,
            )
            self.in_flight = step
        return True

    def wait(self) -> None:
        """Wait for an asynchronous save to be committed (``CheckpointWriteError`` if it
        failed)."""
        if self.in_flight is None:
            return
        step, self.in_flight = self.in_flight, None
        with self._write_errors(step):
            self.manager.wait_until_finished()

    @contextlib.contextmanager
    def _write_errors(self, step: int):
        try:
            yield
        except Exception as e:  # Orbax wraps the OS error in its own types
            os_error = _os_error(e)
            if os_error is None:
                raise
            log.debug("writing checkpoint %d failed", step, exc_info=True)
            self.in_flight = None
            previous = [s for s in self.steps() if s != step]
            raise CheckpointWriteError(
                f"cannot write the checkpoint of step {step} to {self.directory}: "
                f"{os_error.strerror or os_error}; "
                + (
                    f"the checkpoint of step {previous[-1]} stays"
                    if previous
                    else "no earlier checkpoint exists"
                )
            ) from None

    def steps(self) -> list[int]:
        """The committed steps (an asynchronous save still being written is not among them)."""
        return sorted(s for s in self.manager.all_steps() if s != self.in_flight)

    def suspect(self, step: int):
        return self.directory / f"{step}.suspect"

    def mark_suspect(self, step: int, reason: str):
        """Mark ``step`` so that restores skip it; returns the marker's path."""
        marker = self.suspect(step)
        marker.write_text(json.dumps({"step": step, "reason": reason, "time": time.time()}))
        return marker

    def read_meta(self, step: int) -> dict:
        return self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))[
            "meta"
        ]

    def restore(self, abstract_state, *, step: int | None = None, with_data: bool = True):
        """(step, state, data_state, meta) of the newest checkpoint that reads, matches its
        fingerprint and is not marked suspect (of ``step`` alone, if given), or None."""
        candidates = [step] if step is not None else list(reversed(self.steps()))
        for s in candidates:
            if self.suspect(s).exists():
                log.warning(
                    "skipping the checkpoint of step %d: marked suspect (%s; delete that "
                    "file to use it again)",
                    s,
                    self.suspect(s),
                )
                continue
            items = dict(
                state=ocp.args.StandardRestore(abstract_state), meta=ocp.args.JsonRestore()
            )
            if with_data:
                items["data"] = ocp.args.JsonRestore()
            try:
                out = self.manager.restore(s, args=ocp.args.Composite(**items))
            except Exception as e:  # any unreadable checkpoint: fall back
                log.debug("restoring checkpoint %d failed", s, exc_info=True)
                self._set_aside(s, "unreadable", f"{type(e).__name__}: {_first_line(e)}")
                continue
            changed = self._changed_items(out, with_data)
            if changed:
                self._set_aside(s, "corrupt", changed)
                continue
            saved = out["meta"].get("fingerprint")
            if saved is None:
                log.warning(
                    "the checkpoint of step %d has no fingerprint (written by an older "
                    "version): restored unverified",
                    s,
                )
            else:
                got = fingerprint(out["state"])
                differ = [k for k in saved if got.get(k) != saved[k]] + [
                    k for k in got if k not in saved
                ]
                if differ:
                    self._set_aside(
                        s,
                        "corrupt",
                        f"{len(differ)} of {len(got)} arrays differ "
                        f"from what was saved, e.g. {differ[0]}",
                    )
                    continue
            return s, out["state"], out.get("data"), out["meta"]
        return None

    @staticmethod
    def _changed_items(out: dict, with_data: bool) -> str | None:
        """What of a restored checkpoint's metadata or data position differs from the digests
        its metadata keeps (None: nothing, or a checkpoint written before the digests)."""
        meta = out["meta"]
        rest = {k: v for k, v in meta.items() if k != "meta_digest"}
        if "meta_digest" in meta and digest(rest) != meta["meta_digest"]:
            return "its metadata differs from what was saved"
        if with_data and "data_digest" in meta and digest(out.get("data")) != meta["data_digest"]:
            return "its data position differs from what was saved"
        return None

    def _set_aside(
        self,
        step: int,
        why: str,
        detail: str,
        *,
        level: int = logging.ERROR,
        then: str = "trying the previous one",
    ):
        aside = self.directory / f"{step}.{why}.{int(time.time())}"
        (self.directory / str(step)).rename(aside)
        self.manager.reload()
        log.log(
            level,
            "the checkpoint of step %d is %s (%s): moved to %s; %s",
            step,
            why,
            detail,
            aside,
            then,
        )

    def close(self):
        """Wait for an asynchronous save (its errors raised), then release the manager."""
        try:
            self.wait()
        finally:
            self.manager.close()


def digest(value) -> str:
    """SHA-256 of a JSON value as it reads back (tuples as lists, keys sorted)."""
    text = json.dumps(json.loads(json.dumps(value)), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


_STORAGE_ERRNOS = (
    errno.ENOSPC,
    errno.EROFS,
    errno.EACCES,
    errno.EDQUOT,
    errno.EIO,
    errno.EPERM,
    errno.EFBIG,
)
_TS_OS_ERROR = re.compile(r"os_error_code='?(\d+)")


def _os_error(e: BaseException) -> OSError | None:
    """The storage OSError in ``e``'s chain of causes, if any (disk full, file too large,
    read-only, permissions, I/O), or the one TensorStore names in its message (its errors are
    ValueErrors carrying ``[os_error_code='28']`` and no OSError)."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in _STORAGE_ERRNOS:
            return e
        code = _TS_OS_ERROR.search(str(e))
        if code and int(code.group(1)) in _STORAGE_ERRNOS:
            return OSError(int(code.group(1)), os.strerror(int(code.group(1))))
        e = e.__cause__ or e.__context__
    return None


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0][:200] if text else ""


def abstract_with_shardings(state, shardings):
    """ShapeDtypeStructs carrying the target shardings (restore reshards onto them)."""
    return jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), state, shardings
    )
