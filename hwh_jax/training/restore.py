"""Load a trained model back from a training workdir: config, tokenizer and parameters.

The workdir's newest readable checkpoint carries the run's config (``meta``); the tokenizer is
rebuilt from it (the corpus-trained SentencePiece comes from its cache, or is retrained
identically), the model from its ModelConfig, and the parameters are restored onto one device
of this process (in a job of several processes, each process restores its own copy).
"""

from __future__ import annotations

import dataclasses
import logging

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

from hwh_jax import storage
from hwh_jax.data.pipeline import build_splits, load_tokenizer
from hwh_jax.eval.suite import EvalModel
from hwh_jax.layers.config import ModelConfig
from hwh_jax.models.lm import HybridLM
from hwh_jax.training.checkpoint import Checkpointer, abstract_with_shardings
from hwh_jax.training.optimizer import make_optimizer
from hwh_jax.training.specs import TrainSpec, model_for_run, run_specs
from hwh_jax.training.state import init_train_state

log = logging.getLogger(__name__)


@dataclasses.dataclass
class LoadedRun:
    """A trained run read back from its workdir: the model with its restored parameters (on
    one device), its ModelConfig, the tokenizer, the run config and the checkpoint's step."""

    model: HybridLM
    model_cfg: ModelConfig
    tokenizer: object
    config: ml_collections.ConfigDict
    step: int
    workdir: object  # an epath.Path (a local folder or a URL)

    @property
    def train(self) -> TrainSpec:
        """The run's training settings (context length, seed, ...)."""
        return TrainSpec.from_config(self.config)

    @property
    def name(self) -> str:
        return f"{self.model_cfg.arch}@{self.workdir.name}"

    def heldout_stream(self) -> np.ndarray:
        """The run's held-out tokens, rebuilt from its data config (sliceable; read lazily
        from prepared shards)."""
        specs = run_specs(self.config)
        splits = build_splits(specs.data, specs.train.seq_len)
        if splits.heldout is None:
            raise ValueError(f"{self.workdir}: the run has no held-out split")
        return splits.heldout.stream

    def eval_model(self) -> EvalModel:
        """The run as the evaluation suite takes it (held-out text built on first use)."""
        return EvalModel(
            self.model,
            self.tokenizer,
            self.train.seq_len,
            self.name,
            arch=self.model_cfg.arch,
            step=self.step,
            workdir=str(self.workdir),
            heldout=self.heldout_stream,
            seed=self.train.seed,
            retrieval_format=run_specs(self.config).data.retrieval_format,
        )


def load_run(workdir, step: int | None = None) -> LoadedRun:
    """The run in ``workdir`` at ``step`` (default: the newest checkpoint that proves itself;
    ``hwh_jax.training.checkpoint``: unreadable or corrupt ones are moved aside, with one log
    line each, and the previous one is taken)."""
    workdir = storage.absolute(workdir)
    directory = workdir / "checkpoints"
    if not directory.is_dir():
        raise FileNotFoundError(f"no checkpoints/ under {workdir} (is it a launch.train workdir?)")
    ckpt = Checkpointer(workdir, writer=False)
    try:
        steps = ckpt.steps()
        if not steps:
            raise FileNotFoundError(f"no checkpoint in {directory}")
        if step is not None and step not in steps:
            raise ValueError(f"step {step} not in {directory} (have {steps})")
        meta = None
        for s in [step] if step is not None else reversed(steps):
            try:
                meta = ckpt.read_meta(s)
                break
            except Exception as e:  # noqa: BLE001 - its meta unreadable: the state is checked below
                log.debug("meta of step %d unreadable: %s", s, e)
        if meta is None:
            raise ValueError(f"no checkpoint in {directory} has readable metadata")
        config = ml_collections.ConfigDict(meta["config"])
        specs = run_specs(config, data_files=False)  # the data is read only if asked for
        tokenizer = load_tokenizer(specs.data)
        cfg = model_for_run(config, tokenizer.vocab_size)
        tx, _ = make_optimizer(specs.optimizer)
        abstract = jax.eval_shape(
            lambda s: init_train_state(cfg, tx, s), jnp.int32(specs.train.seed)
        )
        device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        abstract = abstract_with_shardings(abstract, jax.tree.map(lambda _: device, abstract))
        restored = ckpt.restore(abstract, step=step, with_data=False)
    finally:
        ckpt.close()
    if restored is None:
        raise ValueError(
            f"no checkpoint in {directory} could be restored"
            + (f" at step {step}" if step is not None else "")
            + " (the lines above say why)"
        )
    step, state = restored[0], restored[1]
    model = nnx.eval_shape(lambda: HybridLM(cfg, rngs=nnx.Rngs(0)))
    graphdef, _, rest = nnx.split(model, nnx.Param, ...)
    model = nnx.merge(graphdef, state["params"], rest)
    return LoadedRun(model, cfg, tokenizer, config, step, workdir)
