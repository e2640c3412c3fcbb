"""Load a trained model back from a training workdir: config, tokenizer and parameters.

The workdir's newest readable checkpoint carries the run's config (``meta``); the tokenizer is
rebuilt from it (the corpus-trained SentencePiece comes from its cache, or is retrained
identically), the model from its ModelConfig, and the parameters are restored onto one device.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
from flax import nnx

from hwh_jax.data.pipeline import build_splits, load_tokenizer
from hwh_jax.eval.suite import EvalModel
from hwh_jax.layers.config import ModelConfig
from hwh_jax.models.lm import HybridLM
from hwh_jax.training.checkpoint import abstract_with_shardings
from hwh_jax.training.optimizer import make_optimizer
from hwh_jax.training.specs import model_config, run_specs
from hwh_jax.training.state import init_train_state


@dataclasses.dataclass
class LoadedRun:
    """A trained run read back from its workdir: the model with its restored parameters (on
    one device), its ModelConfig, the tokenizer, the run config and the checkpoint's step."""
    model: HybridLM
    model_cfg: ModelConfig
    tokenizer: object
    config: ml_collections.ConfigDict
    step: int
    workdir: Path

    @property
    def name(self) -> str:
        return f"{self.model_cfg.arch}@{self.workdir.name}"

    def heldout_stream(self) -> np.ndarray:
        """The run's held-out tokens, rebuilt from its data config."""
        splits = build_splits(run_specs(self.config).data, self.config.seq_len)
        if splits.heldout is None:
            raise ValueError(f"{self.workdir}: the run has no held-out split")
        return np.asarray(splits.heldout.stream)

    def eval_model(self) -> EvalModel:
        """The run as the evaluation suite takes it (held-out text built on first use)."""
        return EvalModel(self.model, self.tokenizer, int(self.config.seq_len), self.name,
                         arch=self.model_cfg.arch, step=self.step, workdir=str(self.workdir),
                         heldout=self.heldout_stream)


def load_run(workdir: str | Path, step: int | None = None) -> LoadedRun:
    workdir = Path(workdir)
    directory = (workdir / "checkpoints").resolve()
    if not directory.is_dir():
        raise FileNotFoundError(f"no checkpoints/ under {workdir} (is it a launch.train workdir?)")
    manager = ocp.CheckpointManager(directory, item_names=("state", "data", "meta"))
    steps = sorted(manager.all_steps())
    if not steps:
        raise FileNotFoundError(f"no checkpoint in {directory}")
    if step is None:
        step = steps[-1]
    elif step not in steps:
        raise ValueError(f"step {step} not in {directory} (have {steps})")
    meta = manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
    config = ml_collections.ConfigDict(meta["config"])
    specs = run_specs(config)
    tokenizer = load_tokenizer(specs.data)
    cfg = model_config(config, tokenizer.vocab_size)
    tx, _ = make_optimizer(specs.optimizer)
    abstract = jax.eval_shape(lambda s: init_train_state(cfg, tx, s), jnp.int32(config.seed))
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    abstract = abstract_with_shardings(abstract, jax.tree.map(lambda _: device, abstract))
    state = manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract)))["state"]
    manager.close()
    model = nnx.eval_shape(lambda: HybridLM(cfg, rngs=nnx.Rngs(0)))
    graphdef, _, rest = nnx.split(model, nnx.Param, ...)
    model = nnx.merge(graphdef, state["params"], rest)
    return LoadedRun(model, cfg, tokenizer, config, step, workdir)


def describe(run: LoadedRun) -> str:
    return json.dumps({"arch": run.model_cfg.arch, "step": run.step, "workdir": str(run.workdir),
                       "seq_len": run.config.seq_len, "tokenizer": run.tokenizer.name})
