"""A run config read into the frozen specs the pieces of a run take, every field checked before
anything is compiled or loaded (errors name the config key and the value)."""

from __future__ import annotations

import dataclasses

from hwh_jax import checks
from hwh_jax.data.pipeline import DataSpec
from hwh_jax.eval.suite import EvalSpec, spec_from_config
from hwh_jax.layers.config import ModelConfig
from hwh_jax.layers.loss import LOSS_IMPLS
from hwh_jax.loggers import parse_loggers
from hwh_jax.models.variants import model_config_from_dict
from hwh_jax.training.optimizer import OptimizerSpec


@dataclasses.dataclass(frozen=True)
class RunSpecs:
    """What a run config asks for: data, optimizer, (when it evaluates at the end) the
    evaluation, and the model, built once here; its vocabulary is provisional until the
    tokenizer's is known (``with_vocabulary``)."""

    data: DataSpec
    optimizer: OptimizerSpec
    eval: EvalSpec | None
    model: ModelConfig
    configured_vocab: int = 0  # model.vocab_size as set (0: the tokenizer's, padded to 64)

    def model_for(self, tokenizer_vocab: int) -> ModelConfig:
        """The run's ModelConfig for a tokenizer of ``tokenizer_vocab`` tokens."""
        return with_vocabulary(self.model, self.configured_vocab, tokenizer_vocab)


def model_for_run(config, tokenizer_vocab: int) -> ModelConfig:
    """The run's ModelConfig; ``model.vocab_size`` 0 takes the tokenizer's, padded to 64."""
    return with_vocabulary(_model(config), config.model.vocab_size, tokenizer_vocab)


def _model(config) -> ModelConfig:
    """The ModelConfig of ``config.model`` (with the size's vocabulary if none is set)."""
    cfg = model_config_from_dict(config.model.to_dict())
    if cfg.attention.impl == "splash" and config.seq_len % 128:
        raise ValueError(
            f"seq_len={config.seq_len}: model.attention.impl='splash' needs a multiple of 128"
        )
    return cfg


def with_vocabulary(cfg: ModelConfig, configured: int, tokenizer_vocab: int) -> ModelConfig:
    """``cfg`` with the vocabulary ``configured`` (model.vocab_size), or with 0 the
    tokenizer's padded to a multiple of 64; a configured one smaller than the tokenizer's is
    an error naming the key."""
    vocab = configured or -(-tokenizer_vocab // 64) * 64
    if vocab < tokenizer_vocab:
        raise ValueError(
            f"model.vocab_size={vocab} is smaller than the tokenizer's vocabulary "
            f"({tokenizer_vocab})"
        )
    return cfg if cfg.vocab_size == vocab else cfg.replace(vocab_size=vocab)


def run_specs(config, data_files: bool = True) -> RunSpecs:
    """Every section of a run config checked; the model with a provisional vocabulary (its
    kernel choices and allocation), so a bad model field fails before the data is read. With
    ``data_files=False`` the data paths need not exist (programs lowered without data)."""
    c = config.train
    data = DataSpec(
        **{
            k: (tuple(v) if isinstance(v, (list, tuple)) else v)
            for k, v in config.data.to_dict().items()
        }
    )
    data.validate(files=data_files)
    opt = OptimizerSpec(
        lr=c.lr,
        min_lr_ratio=c.min_lr_ratio,
        warmup_steps=c.warmup_steps,
        total_steps=c.steps,
        schedule=c.schedule,
        decay_fraction=c.decay_fraction,
        weight_decay=c.weight_decay,
        b1=c.b1,
        b2=c.b2,
        eps=c.eps,
        clip_norm=c.clip_norm,
    )
    opt.validate()
    model = _model(config)  # a bad model field fails here, before the data is read
    if c.loss_impl not in LOSS_IMPLS:
        raise ValueError(f"train.loss_impl must be one of {LOSS_IMPLS}, got {c.loss_impl!r}")
    evaluation = None
    if config.get("eval") is not None and config.eval.at_end:
        evaluation = spec_from_config(config.eval)
        evaluation.validate()
    for key in ("log_every", "profile_steps", "keep_checkpoints", "batch_size"):
        checks.number(f"train.{key}", c[key], lo=1, integer=True)
    for key in ("eval_every", "checkpoint_every", "eval_sequences", "profile_at", "grad_accum"):
        checks.number(f"train.{key}", c[key], lo=0, integer=True)
    checks.number("train.stop_at_step", c.stop_at_step, lo=0, hi=c.steps, integer=True)
    checks.number("train.z_loss", c.z_loss, lo=0)
    checks.number("train.peak_flops", c.peak_flops, lo=0)
    checks.number("train.device_memory_gb", c.device_memory_gb, lo=0)
    checks.number("train.checkpoint_minutes", c.get("checkpoint_minutes", 0.0), lo=0)
    checks.number(
        "train.stop_exit_status", c.get("stop_exit_status", 0), lo=0, hi=255, integer=True
    )
    parse_loggers(c.get("loggers", ""))
    checks.number("seq_len", config.seq_len, lo=2, integer=True)
    checks.number("seed", config.seed, lo=0, integer=True)
    mesh = tuple(c.mesh)
    if (
        len(mesh) not in (3, 4)
        or any(not isinstance(d, int) or isinstance(d, bool) or (d < 1 and d != -1) for d in mesh)
        or mesh.count(-1) > 1
    ):
        raise ValueError(
            f"train.mesh must be three or four sizes (data, fsdp, tensor[, sequence]), each "
            f">= 1 or one of them -1 (the remaining devices), got {mesh!r}"
        )
    if c.profile_at and c.profile_at + c.profile_steps > (c.stop_at_step or c.steps):
        raise ValueError(
            f"train.profile_at={c.profile_at} + train.profile_steps="
            f"{c.profile_steps} runs past the last step "
            f"{c.stop_at_step or c.steps}"
        )
    if c.grad_accum and c.batch_size % c.grad_accum:
        raise ValueError(
            f"train.batch_size={c.batch_size} must be a multiple of train.grad_accum={c.grad_accum}"
        )
    return RunSpecs(data, opt, evaluation, model, config.model.vocab_size)
