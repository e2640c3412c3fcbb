"""A workdir bound to the run that made it: ``<workdir>/config.json`` holds the config of its
first start, and a later start whose model or data differs is refused before anything is read.

Bound (``BOUND``): the model, the data, the sequence length, the seed and the global batch: a
change to any of them makes the checkpoints and the data iterator's position mean something
else. Everything else (steps, learning rate, logging, evaluation, mesh, ...) may change between
starts. ``train.accept_changes`` names bound keys a start may change anyway (comma-separated
dotted keys, or ``all``); the file then records the new config.
"""

from __future__ import annotations

import json

from hwh_jax import storage
from hwh_jax.training.specs import TrainSpec

BOUND = ("seed", "seq_len", "model.", "data.", "train.batch_size")


class WorkdirMismatch(ValueError):
    """The workdir was made by a run with another model or data config."""


def flatten(tree: dict, prefix: str = "") -> dict:
    """{"a.b.c": value} of a nested dict (lists as JSON text, so they compare as written)."""
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = json.dumps(v) if isinstance(v, (list, tuple)) else v
    return out


def _bound(key: str) -> bool:
    return any(key == b or (b.endswith(".") and key.startswith(b)) for b in BOUND)


def differences(saved: dict, current: dict) -> list[tuple[str, object, object]]:
    """(key, saved value, current value) of every bound key that differs."""
    a, b = flatten(saved), flatten(current)
    keys = sorted(k for k in set(a) | set(b) if _bound(k))
    return [(k, a.get(k, "(absent)"), b.get(k, "(absent)")) for k in keys if a.get(k) != b.get(k)]


def checkpoint_config(workdir) -> tuple[dict, str] | tuple[None, list[int]]:
    """(config, where) from the newest checkpoint whose metadata reads (each checkpoint's
    ``meta`` holds its run's config), or (None, the checkpoint steps found: none readable)."""
    folder = storage.path(workdir) / "checkpoints"
    steps = (
        sorted((int(p.name) for p in folder.iterdir() if p.name.isdigit()), reverse=True)
        if folder.exists()
        else []
    )
    for step in steps:
        meta = folder / str(step) / "meta" / "metadata"
        try:
            saved = json.loads(meta.read_text())["config"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if isinstance(saved, dict):
            return saved, f"the checkpoint of step {step}'s metadata"
    return None, steps


def bind(workdir, config, *, write: bool = True) -> None:
    """Check ``config`` against the workdir's ``config.json`` and record it (first start, or
    accepted changes). Raises WorkdirMismatch listing the differing keys and the two ways on.
    A workdir with checkpoints but no ``config.json`` (made before it was written) is checked
    against the newest readable checkpoint's config; checkpoints none of which can be read
    refuse (a new run would set them aside and replace the run's metrics)."""
    path = storage.path(workdir) / "config.json"
    current = json.loads(config.to_json_best_effort())
    saved, where = None, str(path)
    if path.exists():
        try:
            saved = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise WorkdirMismatch(
                f"{path} is not valid JSON ({e}); move it away to bind the "
                f"workdir to this run's config"
            ) from None
    else:
        saved, where = checkpoint_config(workdir)
        if saved is None and where:
            raise WorkdirMismatch(
                f"workdir {workdir} holds checkpoints (steps {where[:5]}) but no config.json and "
                f"no checkpoint whose metadata reads, so this run cannot tell whether they are "
                f"its own; move {storage.path(workdir) / 'checkpoints'} away to start over here, "
                f"or use a new --workdir"
            )
    if saved is not None:
        accept = [
            k.strip() for k in TrainSpec.from_config(config).accept_changes.split(",") if k.strip()
        ]
        diffs = [
            d
            for d in differences(saved, current)
            if "all" not in accept
            and not any(d[0] == a or d[0].startswith(a + ".") for a in accept)
        ]
        if diffs:
            shown = "; ".join(f"{k}: {old!r} -> {new!r}" for k, old, new in diffs[:8])
            more = f" (and {len(diffs) - 8} more)" if len(diffs) > 8 else ""
            keys = ",".join(k for k, _, _ in diffs)
            raise WorkdirMismatch(
                f"workdir {workdir} belongs to a run with another config ({where}): "
                f"{shown}{more}. "
                f"Use a new --workdir, or keep this one and accept the change with "
                f"--config.train.accept_changes={keys}"
            )
    if write:
        storage.write_text(path, json.dumps(current, indent=2))
