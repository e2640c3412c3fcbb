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
import orbax.checkpoint as ocp
from flax import nnx

from hwh_jax.data.pipeline import load_tokenizer
from hwh_jax.models.config import ModelConfig
from hwh_jax.models.lm import HybridLM
from hwh_jax.training.checkpoint import abstract_with_shardings
from hwh_jax.training.optimizer import make_optimizer
from hwh_jax.training.trainer import init_train_state, model_from_config, run_specs


@dataclasses.dataclass
class LoadedRun:
    model: HybridLM
    model_cfg: ModelConfig
    tokenizer: object
    config: ml_collections.ConfigDict
    step: int
    workdir: Path

    @property
    def name(self) -> str:
        return f"{self.model_cfg.arch}@{self.workdir.name}"


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
    data_spec, opt_spec = run_specs(config)
    tokenizer = load_tokenizer(data_spec)
    cfg = model_from_config(config, tokenizer.vocab_size)
    tx, _ = make_optimizer(opt_spec)
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
