"""Where a run's scalars go besides ``metrics.jsonl`` (always written): TensorBoard and
Weights & Biases, chosen by ``train.loggers`` ("tensorboard", "wandb", both comma-separated, or
"").

Each logger takes ``scalars(step, {name: value})``, ``summary(dict)``, ``flush()`` and
``close()``. TensorBoard events are written by tensorboardX into ``<workdir>/tensorboard`` (a
local folder mirrored to the bucket for a ``gs://`` workdir: ``storage.Staged``). W&B is
optional (``pip install "hwh-jax[wandb]"``); its run id is kept in ``<workdir>/wandb_run_id``,
so a resumed run continues the same W&B run; ``WANDB_MODE=offline`` (W&B's own setting) logs
without a network, for a later ``wandb sync``.
"""

from __future__ import annotations

import logging
import uuid

from hwh_jax import storage

log = logging.getLogger(__name__)
KINDS = ("tensorboard", "wandb")


def parse_loggers(spec: str) -> tuple[str, ...]:
    """("tensorboard", "wandb") of "tensorboard,wandb"; ValueError naming a kind not known."""
    kinds = tuple(k.strip() for k in str(spec).split(",") if k.strip())
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        raise ValueError(
            f"train.loggers={spec!r}: {', '.join(unknown)} is not a logger "
            f"(choose from {', '.join(KINDS)}, comma-separated, or '')"
        )
    return kinds


class TensorBoardLogger:
    """Scalars as TensorBoard events under ``<workdir>/tensorboard`` (tensorboardX)."""

    def __init__(self, workdir):
        from tensorboardX import SummaryWriter

        self.staged = storage.Staged(storage.path(workdir) / "tensorboard")
        self.writer = SummaryWriter(str(self.staged.local))

    def scalars(self, step: int, values: dict) -> None:
        for k, v in values.items():
            self.writer.add_scalar(k, v, step)

    def summary(self, values: dict) -> None:
        del values  # summary.json holds it; TensorBoard has no such record

    def flush(self) -> None:
        self.writer.flush()
        self.staged.sync()

    def close(self) -> None:
        self.writer.close()
        self.staged.sync()


class WandbLogger:
    """Scalars, config and summary to a W&B run whose id the workdir keeps."""

    ID_FILE = "wandb_run_id"

    def __init__(self, workdir, *, config: dict, name: str, project: str):
        try:
            import wandb
        except ImportError:
            raise ValueError(
                "train.loggers names wandb, which is not installed: "
                'pip install "hwh-jax[wandb]" (or drop wandb from train.loggers)'
            ) from None
        self.wandb = wandb
        id_file = storage.path(workdir) / self.ID_FILE
        run_id = id_file.read_text().strip() if id_file.exists() else uuid.uuid4().hex[:8]
        self.staged = storage.Staged(storage.path(workdir) / "wandb")
        self.run = wandb.init(
            project=project,
            id=run_id,
            resume="allow",
            name=name,
            config=config,
            dir=str(self.staged.local),
        )
        if not id_file.exists():
            storage.write_text(id_file, run_id)
        log.info(
            "W&B run %s (project %s, mode %s)",
            run_id,
            project,
            getattr(self.run.settings, "mode", "?"),
        )

    def scalars(self, step: int, values: dict) -> None:
        self.run.log(values, step=step)

    def summary(self, values: dict) -> None:
        self.run.summary.update(values)

    def flush(self) -> None:
        pass  # wandb streams from its own process

    def close(self) -> None:
        self.run.finish()
        self.staged.sync()


def make_loggers(spec: str, workdir, *, config: dict, name: str, project: str) -> list:
    """The loggers ``spec`` names (tensorboardX missing: TensorBoard left out, with a warning)."""
    out = []
    for kind in parse_loggers(spec):
        if kind == "tensorboard":
            try:
                out.append(TensorBoardLogger(workdir))
            except ImportError:
                log.warning("tensorboardX is not installed: no TensorBoard events")
        else:
            out.append(WandbLogger(workdir, config=config, name=name, project=project))
    return out
