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
class TrainSpec:
    """How a run trains: the context, the seed and the ``train`` section of a run config but the
    optimizer's fields (``OptimizerSpec``). The one definition of their defaults:
    configs/base.py builds ``config.train`` from these fields; a run config saved before a
    field existed takes its default here (``from_config``)."""

    seq_len: int = 2048  # training context length (config.seq_len)
    seed: int = 0  # init and data-order seed (config.seed)
    steps: int = OptimizerSpec.total_steps
    stop_at_step: int = 0  # stop (with a checkpoint) before `steps`; 0 = no
    # bound keys (model.*, data.*, seq_len, seed, train.batch_size) this start may change in a
    # workdir made by another config: "a.b,c" or "all"
    accept_changes: str = ""
    batch_size: int = 256  # global batch, sequences
    # micro-batches per step; 0 = the fewest that fit the devices (hwh_jax/training/memory.py)
    grad_accum: int = 0
    device_memory_gb: float = 0.0  # memory a device may use; 0 = what it reports
    # the LM head + loss as one op (layers.loss.head_loss) with softmax_xent impl "auto" |
    # "reference" | "pallas"; or "unfused" (autodiff through the logits)
    loss_impl: str = "auto"
    z_loss: float = 0.0  # e.g. 1e-4 for PaLM's z-loss
    document_mask: bool = True  # attend / recur within documents only (False: across them)
    mesh: tuple = (-1, 1, 1)  # (data, fsdp, tensor[, sequence]); -1 = the remaining devices
    # run a tensor axis that some layers' head counts cannot split (refused otherwise:
    # training/preflight.py)
    allow_unsplit_heads: bool = False
    # run an fsdp axis that leaves weight shards fewer rows than a TPU tile (refused on TPUs
    # otherwise: training/preflight.py)
    allow_small_shards: bool = False
    log_every: int = 50
    eval_every: int = 1000
    # held-out sequences per evaluation, the same rows for every run whatever its batch
    # (data.pipeline.eval_order; 0 = all)
    eval_sequences: int = 320
    final_eval: bool = True  # held-out evaluation after the last step
    checkpoint_every: int = 1000
    # also save when this much wall time passed since the last save (0 = by steps only)
    checkpoint_minutes: float = 0.0
    keep_checkpoints: int = 3
    # the workdir's lease goes stale this long after its holder's last heartbeat (0: no
    # lease; lease.py)
    lease_seconds: float = 120.0
    async_checkpoints: bool = True  # write checkpoints while training goes on
    # exit status after a SIGTERM/SIGINT stop with its checkpoint saved; 75 lets a supervisor
    # relaunch
    stop_exit_status: int = 0
    # besides metrics.jsonl: "", "tensorboard", "wandb", or both comma-separated (wandb: the
    # [wandb] extra)
    loggers: str = "tensorboard"
    wandb_project: str = "hwh-jax"  # W&B project; the run id is kept in the workdir
    peak_flops: float = 0.0  # per-device peak for MFU; 0 = from the device kind
    # trace the steps after this one (0 = never) into <workdir>/profile;
    # hwh_jax.profiling.profile sums them
    profile_at: int = 0
    profile_steps: int = 5

    TOP_LEVEL = ("seq_len", "seed")  # fields read from the config's top level, not train

    @classmethod
    def section_fields(cls) -> list[str]:
        """The fields that live in a config's ``train`` section."""
        return [f.name for f in dataclasses.fields(cls) if f.name not in cls.TOP_LEVEL]

    @classmethod
    def from_config(cls, config) -> "TrainSpec":
        """The spec of a run config (ConfigDict); a field the config lacks (a run saved before
        the field existed) takes its default."""
        t = config.train
        values = {k: config[k] for k in cls.TOP_LEVEL if k in config}
        values.update({k: t[k] for k in cls.section_fields() if k in t})
        if "mesh" in values:
            values["mesh"] = tuple(values["mesh"])
        return cls(**values)

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.seq_len

    @property
    def last_step(self) -> int:
        """The step this start trains to: ``stop_at_step`` if set, else ``steps``."""
        return self.stop_at_step or self.steps

    def validate(self) -> None:
        """Every field in range; errors name the config key and the value."""
        for key in ("log_every", "profile_steps", "keep_checkpoints", "batch_size"):
            checks.number(f"train.{key}", getattr(self, key), lo=1, integer=True)
        for key in ("eval_every", "checkpoint_every", "eval_sequences", "profile_at", "grad_accum"):
            checks.number(f"train.{key}", getattr(self, key), lo=0, integer=True)
        checks.number("train.stop_at_step", self.stop_at_step, lo=0, hi=self.steps, integer=True)
        for key in ("z_loss", "peak_flops", "device_memory_gb", "checkpoint_minutes"):
            checks.number(f"train.{key}", getattr(self, key), lo=0)
        checks.number("train.stop_exit_status", self.stop_exit_status, lo=0, hi=255, integer=True)
        if self.loss_impl not in LOSS_IMPLS:
            raise ValueError(f"train.loss_impl must be one of {LOSS_IMPLS}, got {self.loss_impl!r}")
        parse_loggers(self.loggers)
        checks.number("seq_len", self.seq_len, lo=2, integer=True)
        checks.number("seed", self.seed, lo=0, integer=True)
        mesh = self.mesh
        if (
            len(mesh) not in (3, 4)
            or any(
                not isinstance(d, int) or isinstance(d, bool) or (d < 1 and d != -1) for d in mesh
            )
            or mesh.count(-1) > 1
        ):
            raise ValueError(
                f"train.mesh must be three or four sizes (data, fsdp, tensor[, sequence]), each "
                f">= 1 or one of them -1 (the remaining devices), got {mesh!r}"
            )
        if self.profile_at and self.profile_at + self.profile_steps > self.last_step:
            raise ValueError(
                f"train.profile_at={self.profile_at} + train.profile_steps="
                f"{self.profile_steps} runs past the last step {self.last_step}"
            )
        if self.grad_accum and self.batch_size % self.grad_accum:
            raise ValueError(
                f"train.batch_size={self.batch_size} must be a multiple of "
                f"train.grad_accum={self.grad_accum}"
            )


@dataclasses.dataclass(frozen=True)
class RunSpecs:
    """What a run config asks for: data, optimizer, (when it evaluates at the end) the
    evaluation, and the model, built once here; its vocabulary is provisional until the
    tokenizer's is known (``with_vocabulary``)."""

    data: DataSpec
    optimizer: OptimizerSpec
    eval: EvalSpec | None
    model: ModelConfig
    train: TrainSpec = TrainSpec()
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
    train = TrainSpec.from_config(config)
    train.validate()
    model = _model(config)  # a bad model field fails here, before the data is read
    evaluation = None
    if config.get("eval") is not None and config.eval.at_end:
        evaluation = spec_from_config(config.eval)
        evaluation.validate()
    return RunSpecs(data, opt, evaluation, model, train, config.model.vocab_size)
