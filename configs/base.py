"""Shared defaults of every run config. ``get_config("hwh_tiny")`` or ``"arch=hwh,size=tiny"``.

Only launchers and the trainer read this ConfigDict; the model gets a frozen ModelConfig built
by ``hwh_jax.models.variants.model_config_from_dict(config.model)``.
"""

from __future__ import annotations

import dataclasses

import ml_collections

from hwh_jax.data.pipeline import DataSpec
from hwh_jax.eval.suite import EvalSpec
from hwh_jax.layers import heads
from hwh_jax.layers.config import (
    KERNEL_SETTINGS,
    KIND_SETTINGS_SET_HERE,
    SETTINGS_SET_HERE,
    ModelConfig,
)
from hwh_jax.models import schedules
from hwh_jax.models.variants import ARCHS, SIZES
from hwh_jax.training.optimizer import OptimizerSpec
from hwh_jax.training.specs import TrainSpec

MODEL_FIELDS = (  # config.model's keys that are ModelConfig fields, its defaults taken as they are
    "q_per_kv",
    "qk_norm",
    "rope_theta",
    "rope_pairing",
    "la_chunk_size",
    "la_kind",
    "la_short_conv",
    "remat",
    "kernel_platform",
)


def settings_config(cls, skip=()) -> ml_collections.ConfigDict:
    """A kernel op's settings dataclass as a ConfigDict of its defaults (``skip``: fields set
    elsewhere); a setting whose default is None (chosen from the shape) takes a typed
    placeholder, so the command line can still set it."""
    c = ml_collections.ConfigDict()
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        if f.default is None:
            kind = int if "int" in str(f.type) else str
            c[f.name] = ml_collections.config_dict.placeholder(kind)
        else:
            c[f.name] = f.default
    return c


def parse_arg(arg: str | None) -> tuple[str, str]:
    """'hwh_tiny' or 'arch=hwh,size=tiny' -> ('hwh', 'tiny')."""
    if not arg:
        return "hwh", "tiny"
    if "=" in arg:
        kv = dict(part.split("=", 1) for part in arg.split(","))
        return kv.get("arch", "hwh"), kv.get("size", "tiny")
    arch, _, size = arg.rpartition("_")
    if arch not in ARCHS or size not in SIZES:
        raise ValueError(
            f"config variant {arg!r} is not <arch>_<size> with arch in {ARCHS} "
            f"and size in {list(SIZES)}"
        )
    return arch, size


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    arch, size = parse_arg(arg)
    config = ml_collections.ConfigDict()
    config.seed = TrainSpec.seed  # init and data-order seed
    config.seq_len = TrainSpec.seq_len if size != "tiny" else 256  # training context length
    m = config.model = ml_collections.ConfigDict()
    m.arch = arch  # one of hwh_jax.models.ARCHS
    m.size = size  # row of hwh_jax.models.SIZES
    m.fa_share = schedules.HWH_FA_SHARE  # hwh*: FA heads / all heads (< 0.25)
    m.counts = ""  # hwh*: per-layer FA counts "0,2,3,0" or a JSON path
    m.ratio = schedules.RATIO  # layerwise/swa: FA layers : other layers
    m.window = 0  # swa: local window (0 = the size's default)
    m.num_layers = 0  # depth at the size's widths (0 = the size's; hwh: counts follow it)
    m.vocab_size = 0  # 0 = the size's default (tokenizer must fit in it)
    m.dtype = "float32" if size == "tiny" else "bfloat16"  # compute dtype (params stay fp32);
    #                                        tiny runs on CPUs, where bf16 is emulated and slow
    # each kernel op's settings (impl and launch settings, kernels_pallas/<op>/settings.py):
    # model.attention, decode_attention, gdn, decay, hgrn, conv, norm, matmul, e.g.
    # --config.model.gdn.impl=chunk_reference --config.model.gdn.wy_apply=triton
    for name, cls in KERNEL_SETTINGS.items():
        m[name] = settings_config(cls, skip=SETTINGS_SET_HERE[name])
    # a linear-head kind with kernel settings of its own (HeadKind.settings): model.<kind>
    for name, cls in heads.configured_settings().items():
        m[name] = settings_config(cls, skip=KIND_SETTINGS_SET_HERE)
    # ModelConfig's own fields a run may set, with its defaults and comments
    # (hwh_jax/layers/config.py): q_per_kv, qk_norm, rope_theta, rope_pairing, la_chunk_size,
    # la_kind (docs/models.md), la_short_conv, remat (hwh_jax/layers/remat.py), kernel_platform
    defaults = {f.name: f.default for f in dataclasses.fields(ModelConfig)}
    for name in MODEL_FIELDS:
        m[name] = defaults[name]
    # data: every field of hwh_jax.data.pipeline.DataSpec (its defaults and comments)
    d = config.data = ml_collections.ConfigDict(dataclasses.asdict(DataSpec()))
    if size != "tiny":
        d.tokenizer = "gpt2"

    # train: every field of hwh_jax.training.specs.TrainSpec but seq_len and seed (above), with
    # its defaults and comments there, then the optimizer's: every field of
    # hwh_jax.training.optimizer.OptimizerSpec but total_steps (train.steps)
    t = config.train = ml_collections.ConfigDict(
        {f: getattr(TrainSpec, f) for f in TrainSpec.section_fields()}
    )
    for f in dataclasses.fields(OptimizerSpec):
        if f.name != "total_steps":
            t[f.name] = f.default
    if size == "tiny":
        t.steps, t.batch_size, t.log_every, t.eval_every = 250, 16, 25, 50
        t.checkpoint_every, t.lr, t.warmup_steps = 100, 3e-3, 25

    # The evaluation after training: every field of hwh_jax.eval.EvalSpec (its defaults and
    # comments), plus at_end.
    e = config.eval = ml_collections.ConfigDict(dataclasses.asdict(EvalSpec()))
    e.at_end = size == "tiny"  # evaluate the final model (writes <workdir>/eval)
    if size == "tiny":  # the main job's evaluation: about a minute on a CPU
        e.niah_factors, e.niah_depths, e.ppl_factor = (1, 2), 3, 2
        e.niah_samples = 1  # 9 prompts a length: intervals of +-30 points or more
    config.lock()
    return config
