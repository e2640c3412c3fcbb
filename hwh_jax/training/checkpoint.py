"""Orbax checkpoints of the train state plus the data iterator's state and run metadata.

Layout under ``<workdir>/checkpoints/<step>/``: ``state`` (params, optimizer state, step, rng;
sharded arrays, restorable onto any mesh), ``data`` (Grain iterator state, JSON) and ``meta``
(JSON: config, tokens seen). Restore walks back from the newest step: a step that cannot be
read is reported, moved aside (``<step>.unreadable.<time>``, kept for inspection) and the
previous one is tried.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path

import jax
import orbax.checkpoint as ocp

log = logging.getLogger(__name__)


class Checkpointer:
    """The run's Orbax checkpoints under ``<workdir>/checkpoints``: ``save`` (synchronous) and
    ``restore`` of the newest readable step, falling back past unreadable ones (module
    docstring)."""
    def __init__(self, workdir: str | Path, *, keep: int = 3):
        self.directory = Path(workdir).resolve() / "checkpoints"
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True,
                                               enable_async_checkpointing=False)
        self.manager = ocp.CheckpointManager(self.directory, options=options,
                                             item_names=("state", "data", "meta"))

    def save(self, step: int, state, data_state: dict, meta: dict) -> None:
        self.manager.save(step, args=ocp.args.Composite(
            state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data_state),
            meta=ocp.args.JsonSave(meta)), force=True)
        self.manager.wait_until_finished()

    def steps(self) -> list[int]:
        return sorted(self.manager.all_steps())

    def restore(self, abstract_state):
        """(step, state, data_state, meta) of the newest readable checkpoint, or None."""
        for step in reversed(self.steps()):
            try:
                out = self.manager.restore(step, args=ocp.args.Composite(
                    state=ocp.args.StandardRestore(abstract_state), data=ocp.args.JsonRestore(),
                    meta=ocp.args.JsonRestore()))
                return step, out["state"], out["data"], out["meta"]
            except Exception as e:  # noqa: BLE001 - any unreadable checkpoint: fall back
                aside = self.directory / f"{step}.unreadable.{int(time.time())}"
                log.error("checkpoint at step %d in %s is unreadable (%s: %s); moved to %s, "
                          "trying the previous one", step, self.directory, type(e).__name__, e,
                          aside.name)
                (self.directory / str(step)).rename(aside)
                self.manager.reload()
        return None

    def close(self):
        self.manager.close()


def abstract_with_shardings(state, shardings):
    """ShapeDtypeStructs carrying the target shardings (restore reshards onto them)."""
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                        state, shardings)
