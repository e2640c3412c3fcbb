"""AdamW with warmup + cosine or WSD schedule, global-norm clipping and a weight-decay mask."""

from __future__ import annotations

import dataclasses
import logging

import jax
import optax

from hwh_jax import checks
from hwh_jax.layers import heads

NO_DECAY_NAMES = ("bias", "weight")  # norms' scale is called "weight"
SCHEDULES = ("cosine", "wsd", "constant")

log = logging.getLogger(__name__)
_WARNED: set = set()


@dataclasses.dataclass(frozen=True)
class OptimizerSpec:
    """AdamW's settings with its learning-rate schedule (warmup, then cosine / WSD / constant),
    global-norm clipping and weight decay; ``validate`` names the bad ``train.*`` key."""

    lr: float = 3e-4  # peak learning rate
    min_lr_ratio: float = 0.1  # final lr / peak lr
    warmup_steps: int = 1000
    total_steps: int = 20000  # train.steps in a run config
    schedule: str = "cosine"  # "cosine" | "wsd" (warmup-stable-decay) | "constant"
    decay_fraction: float = 0.2  # wsd: share of steps in the final linear decay
    weight_decay: float = 0.1
    b1: float = 0.9
    b2: float = 0.95
    eps: float = 1e-8
    clip_norm: float = 1.0  # global-norm clipping; 0 = none

    def validate(self):
        """Every field finite and in range; errors name the ``train.*`` key."""
        if self.schedule not in SCHEDULES:
            raise ValueError(f"train.schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        checks.number("train.lr", self.lr, lo=0, lo_open=True)
        checks.number("train.steps", self.total_steps, lo=1, integer=True)
        checks.number("train.warmup_steps", self.warmup_steps, lo=0, integer=True)
        checks.number("train.min_lr_ratio", self.min_lr_ratio, lo=0, hi=1)
        checks.number("train.decay_fraction", self.decay_fraction, lo=0, hi=1, lo_open=True)
        checks.number("train.weight_decay", self.weight_decay, lo=0)
        checks.number("train.b1", self.b1, lo=0, hi=1, hi_open=True)
        checks.number("train.b2", self.b2, lo=0, hi=1, hi_open=True)
        checks.number("train.eps", self.eps, lo=0, lo_open=True)
        checks.number("train.clip_norm", self.clip_norm, lo=0)
        if (
            self.warmup_steps >= self.total_steps
            and (self.warmup_steps, self.total_steps, self.lr) not in _WARNED
        ):
            _WARNED.add((self.warmup_steps, self.total_steps, self.lr))  # once a process
            peak = float(learning_rate_schedule(self)(self.total_steps - 1))
            log.warning(
                "train.warmup_steps=%d is not below train.steps=%d: the learning rate "
                "never reaches train.lr=%g (the last step's is %.3g); lower "
                "train.warmup_steps to warm up and then train",
                self.warmup_steps,
                self.total_steps,
                self.lr,
                peak,
            )


def learning_rate_schedule(spec: OptimizerSpec) -> optax.Schedule:
    warm = max(spec.warmup_steps, 0)
    end = spec.lr * spec.min_lr_ratio
    if spec.schedule == "constant":
        main = optax.constant_schedule(spec.lr)
    elif spec.schedule == "cosine":
        main = optax.cosine_decay_schedule(
            spec.lr, max(spec.total_steps - warm, 1), alpha=spec.min_lr_ratio
        )
    else:  # wsd: hold the peak, then decay linearly over the last decay_fraction of steps
        decay = max(int(spec.total_steps * spec.decay_fraction), 1)
        stable = max(spec.total_steps - warm - decay, 0)
        main = optax.join_schedules(
            [optax.constant_schedule(spec.lr), optax.linear_schedule(spec.lr, end, decay)], [stable]
        )
    if warm == 0:
        return main
    return optax.join_schedules([optax.linear_schedule(0.0, spec.lr, warm), main], [warm])


def decay_mask(params):
    """True for weights that decay: matrices and embeddings, not norms, biases, nor what a
    linear-head kind names in its ``no_decay`` (GDN's and Mamba-2's A_log, dt_bias)."""

    def keep(path, leaf):
        keys = [k.key for k in path if isinstance(k, jax.tree_util.DictKey)]
        name = str(keys[-1]) if keys else ""
        return name not in skip and getattr(leaf, "ndim", 0) >= 2

    skip = set(NO_DECAY_NAMES).union(*(heads.get(k).no_decay for k in heads.names()))
    return jax.tree_util.tree_map_with_path(keep, params)


def make_optimizer(spec: OptimizerSpec) -> tuple[optax.GradientTransformation, optax.Schedule]:
    spec.validate()
    schedule = learning_rate_schedule(spec)
    parts = [optax.clip_by_global_norm(spec.clip_norm)] if spec.clip_norm > 0 else []
    parts.append(
        optax.adamw(
            schedule,
            b1=spec.b1,
            b2=spec.b2,
            eps=spec.eps,
            weight_decay=spec.weight_decay,
            mask=decay_mask,
        )
    )
    return optax.chain(*parts), schedule
