"""The MQAR sweep's settings: ``SweepSpec`` (the mixed sweep's defaults), ``zoology_spec``
(Zoology's own Figure 2) and each cell's model (``sweep_config``)."""

from __future__ import annotations

import dataclasses

import numpy as np

from hwh_jax.layers.config import LayerSpec, ModelConfig
from hwh_jax.models.variants import build_layers

ARCHS = ("transformer", "gdn", "layerwise", "hwh", "hwh_rope")
MODES = ("mixed", "zoology")
ZOOLOGY_ARCHS = ("transformer", "gdn", "hwh")


def zoology_batch(length: int) -> int:
    """Zoology's Figure 2 batch for sequences of ``length`` tokens."""
    return 64 if length >= 1024 else 128 if length >= 512 else 256 if length >= 256 else 512


@dataclasses.dataclass(frozen=True)
class SweepSpec:
    """What the sweep trains and scores (defaults: Zoology's settings of its width figure)."""

    archs: tuple = ("transformer", "gdn", "layerwise", "hwh", "hwh_rope")
    widths: tuple = (64, 128, 256, 512)
    settings: tuple = ((64, 4), (128, 8), (256, 16), (512, 64))  # (sequence length, pairs)
    vocab: int = 8192
    heads: int = 4  # heads a layer; HwH: 1 FA + 3 GDN in each of its 2 layers
    steps: int = 6000
    batch_size: int = 64
    lrs: tuple = (1e-3, 3e-3, 1e-2)
    seeds: tuple = (0, 1, 2)
    warmup_steps: int = 100
    weight_decay: float = 0.1
    eval_examples: int = 256  # per setting, validation and test each
    dtype: str = "bfloat16"
    mode: str = "mixed"  # "mixed": the settings in one model; "zoology": Zoology's Figure 2
    train_examples: int = 0  # zoology: a fixed training set of this many examples a setting
    epochs: int = 0  # zoology: passes over it (steps = epochs x train_examples // batch)

    def validate(self):
        if self.mode not in MODES:
            raise ValueError(f"--mode: {self.mode!r} is not one of {MODES}")
        zoology = self.mode == "zoology"
        archs = ZOOLOGY_ARCHS if zoology else ARCHS
        for arch in self.archs:
            if arch not in archs:
                raise ValueError(f"--archs: {arch!r} is not one of {archs} (--mode={self.mode})")
        for w in self.widths:
            if zoology and w % 4:
                raise ValueError(f"--widths: {w} must be a multiple of 4 in --mode=zoology")
            if not zoology and (w < self.heads or w % self.heads or (w // self.heads) % 2):
                raise ValueError(
                    f"--widths: {w} must split into --heads={self.heads} heads of an even dimension"
                )
        if zoology:
            if self.train_examples < 1 or self.epochs < 1:
                raise ValueError(
                    f"--mode=zoology trains a fixed set: --train_examples "
                    f"({self.train_examples}) and --epochs ({self.epochs}) must be >= 1"
                )
            for i in range(len(self.settings)):
                one = self.for_setting(i)
                if one.batch_size > self.train_examples:
                    raise ValueError(
                        f"--train_examples={self.train_examples} is fewer than a batch of "
                        f"{one.batch_size} (--batch_size)"
                    )
        for length, pairs in self.settings:
            if pairs * 4 > length or length >= self.vocab:
                raise ValueError(
                    f"--settings: {pairs} pairs in {length} tokens (need 4 x pairs "
                    f"<= length < --vocab={self.vocab})"
                )
        for name in ("steps", "batch_size", "eval_examples")[2 * zoology :]:
            if getattr(self, name) < 1:
                raise ValueError(f"--{name} must be >= 1, got {getattr(self, name)}")
        if not self.lrs or not self.seeds or min(self.lrs) <= 0:
            raise ValueError(f"--lrs (> 0) and --seeds must be non-empty: {self.lrs}, {self.seeds}")

    @property
    def max_len(self) -> int:
        return max(length for length, _ in self.settings)

    def for_setting(self, i: int) -> "SweepSpec":
        """Zoology mode: the spec of setting ``i``'s own models: that setting alone, its batch
        (``batch_size``, or 0 for Zoology's by length) and the steps of ``epochs`` passes."""
        length, pairs = self.settings[i]
        batch = self.batch_size or zoology_batch(length)
        return dataclasses.replace(
            self,
            settings=((length, pairs),),
            batch_size=batch,
            steps=self.epochs * (self.train_examples // batch),
        )


def zoology_spec(**overrides) -> SweepSpec:
    """Zoology's Figure 2 (module docstring), with ``overrides`` (e.g. fewer widths)."""
    spec = dict(
        mode="zoology",
        archs=ZOOLOGY_ARCHS,
        widths=(64, 128, 256, 512),
        settings=((64, 4), (128, 8), (256, 16), (512, 64)),
        lrs=tuple(float(x) for x in np.logspace(-4, -2, 4)),
        train_examples=100_000,
        epochs=64,
        batch_size=0,  # Zoology's by sequence length
        steps=0,  # from the epochs
        eval_examples=3_000,
        warmup_steps=0,
        weight_decay=0.01,
    )
    return SweepSpec(**{**spec, **overrides})


def sweep_config(arch: str, width: int, spec: SweepSpec) -> ModelConfig:
    """The 2-layer model of ``arch`` at ``width``: layer-wise = one FA layer after one GDN layer,
    HwH = 1 FA head (NoPE, or RoPE for hwh_rope) beside heads - 1 GDN heads in each layer (the
    full-size rules, an FA share below 1/4 and no FA heads in the first and last layer, cannot
    hold in two layers)."""
    if spec.mode == "zoology":
        return _zoology_config(arch, width, spec)
    h = spec.heads
    if arch in ("hwh", "hwh_rope"):
        layers = tuple(LayerSpec(1, h - 1, fa_rope=arch == "hwh_rope") for _ in range(2))
    else:
        layers = build_layers(arch, 2, h, ratio=(1, 1))
    return ModelConfig(
        vocab_size=spec.vocab,
        d_model=width,
        num_heads=h,
        head_dim=width // h,
        la_key_dim=width // h,
        la_value_dim=width // h,
        mlp_hidden=-(-2 * width // 64) * 64,
        layers=layers,
        arch=arch,
        dtype=spec.dtype,
        la_chunk_size=min(64, spec.max_len),
    )


def _zoology_config(arch: str, width: int, spec: SweepSpec) -> ModelConfig:
    """Zoology's 2-layer models without an MLP: attention one head with learned absolute
    positions (its ``max_position_embeddings``), GDN two heads, HwH one NoPE FA head beside one
    GDN head (each half the width)."""
    heads = {"transformer": (1, 0), "gdn": (0, 2), "hwh": (1, 1)}[arch]
    dim = width // sum(heads)
    return ModelConfig(
        vocab_size=spec.vocab,
        d_model=width,
        num_heads=sum(heads),
        head_dim=dim,
        la_key_dim=dim,
        la_value_dim=dim,
        mlp_hidden=0,
        layers=(LayerSpec(*heads),) * 2,
        abs_positions=spec.max_len if arch == "transformer" else 0,
        arch=arch,
        dtype=spec.dtype,
        la_chunk_size=min(64, spec.max_len),
    )
