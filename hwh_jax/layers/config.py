"""The frozen model description the layers receive: sizes, a per-layer head allocation and the
kernel settings.

Every architecture of the study is a tuple of ``LayerSpec``: how many full-attention (FA) and
Gated DeltaNet (LA) heads layer l has, whether its FA heads use RoPE, and their window. Named
schedules that build these tuples live in ``hwh_jax.models.schedules``; sizes in
``hwh_jax.models.variants``. It sits below the layers that read it (the mixer, the blocks).
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from hwh_jax.layers import heads, remat
from hwh_jax.layers.rope import PAIRINGS
from kernels_pallas import (
    AttentionSettings,
    DecaySettings,
    DecodeAttentionSettings,
    GatedRecurrenceSettings,
    GDNSettings,
    RMSNormSettings,
    ShortConvSettings,
    SkinnyMatmulSettings,
)

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


@dataclasses.dataclass(frozen=True)
class LayerSpec:
    """One layer's token mixer: ``num_fa`` full-attention query heads beside ``num_la`` Gated
    DeltaNet heads (either may be 0, not both), RoPE or NoPE on the FA heads, and their sliding
    window (None: global)."""

    num_fa: int  # full-attention query heads in this layer
    num_la: int  # Gated DeltaNet heads in this layer
    fa_rope: bool = False  # RoPE on this layer's FA heads (False = NoPE)
    window: int | None = None  # sliding window of the FA heads (None = global)

    def __post_init__(self):
        if self.num_fa < 0 or self.num_la < 0 or self.num_fa + self.num_la == 0:
            raise ValueError(
                f"LayerSpec needs num_fa, num_la >= 0 and at least one head, got "
                f"num_fa={self.num_fa}, num_la={self.num_la}"
            )
        if self.window is not None and self.window < 1:
            raise ValueError(f"LayerSpec.window must be >= 1 or None, got {self.window}")


KERNEL_SETTINGS = {  # ModelConfig field -> the settings value it holds
    "attention": AttentionSettings,
    "decode_attention": DecodeAttentionSettings,
    "gdn": GDNSettings,
    "decay": DecaySettings,
    "hgrn": GatedRecurrenceSettings,
    "conv": ShortConvSettings,
    "norm": RMSNormSettings,
    "matmul": SkinnyMatmulSettings,
}
SETTINGS_SET_HERE = {  # settings ModelConfig fills in itself (not set per op in a run config)
    name: ("interpret", "platform") + (("chunk_size",) if name in ("gdn", "decay") else ())
    for name in KERNEL_SETTINGS
}
KIND_SETTINGS_SET_HERE = ("interpret", "platform", "chunk_size")  # of a kind's own settings
LEGACY_IMPL_KEYS = {  # the earlier flat fields, e.g. gdn_impl="pallas" -> gdn.impl
    "attn_impl": "attention",
    "decode_attn_impl": "decode_attention",
    "gdn_impl": "gdn",
    "decay_impl": "decay",
    "hgrn_impl": "hgrn",
    "conv_impl": "conv",
    "norm_impl": "norm",
    "matmul_impl": "matmul",
}


def settings_from(fields: dict) -> dict:
    """``fields`` with each kernel setting as its settings value: a mapping (a run config's
    ``model.gdn``) becomes ``GDNSettings(**it)``, and a legacy ``gdn_impl="pallas"`` the
    default settings with that impl. Errors name the key."""
    out = dict(fields)
    for old, name in LEGACY_IMPL_KEYS.items():
        if old in out:
            impl = out.pop(old)
            current = out.get(name, {})
            current = dataclasses.asdict(current) if dataclasses.is_dataclass(current) else current
            out[name] = {**dict(current), "impl": impl}
    for name, cls in KERNEL_SETTINGS.items():
        if out.get(name) is not None:
            out[name] = _settings_value(name, cls, out[name], SETTINGS_SET_HERE[name])
    own = dict(out.pop("kind_settings", None) or ())
    for name, cls in heads.own_settings().items():
        if name in out:
            own[name] = _settings_value(name, cls, out.pop(name), KIND_SETTINGS_SET_HERE)
    if own:
        out["kind_settings"] = tuple(sorted(own.items()))
    return out


def _settings_value(name: str, cls: type, value, set_here):
    """``value`` (a ``cls`` or a mapping of its settings) as a ``cls``; errors name model.<name>."""
    if isinstance(value, cls):
        return value
    value = dict(value)
    unknown = set(value) - {f.name for f in dataclasses.fields(cls)}
    if unknown:
        raise ValueError(
            f"model.{name} has no setting {sorted(unknown)}; {cls.__name__} takes "
            f"{[f.name for f in dataclasses.fields(cls) if f.name not in set_here]}"
        )
    try:
        return cls(**value)
    except (TypeError, ValueError) as e:
        raise ValueError(f"model.{name}: {e}") from None


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Everything that defines a ``HybridLM``: widths, the layers' head allocation
    (``layers``), FA head options (GQA, q/k norm, RoPE), dtypes and each kernel op's settings
    value (``attention``, ``gdn``, ...; ``*_settings()`` gives it with the platform and chunk
    filled in). Values are checked when it is built; errors name the field."""

    vocab_size: int
    d_model: int
    num_heads: int  # head slots per layer (FA + LA) of the named size
    head_dim: int  # FA head dim D
    la_key_dim: int  # GDN key/query dim K
    la_value_dim: int  # GDN value dim V (= width of its slot in o_proj)
    mlp_hidden: int  # SwiGLU hidden width; 0 = no MLP (a block is its mixer alone)
    layers: tuple[LayerSpec, ...]
    arch: str = "custom"  # schedule name, for display only
    q_per_kv: int = 1  # GQA: FA query heads per kv head (1 = MHA)
    qk_norm: bool = False  # per-head RMSNorm on FA q and k (Qwen3)
    rope_theta: float = 10000.0
    rope_pairing: str = "half"  # "half" (HF Llama/Qwen) or "interleaved"
    rope_scaling: tuple = ()  # ((key, value), ...), e.g. Llama 3.1's rope_type "llama3"
    conv_size: int = 4  # GDN short causal convolution width
    tie_embeddings: bool = True
    abs_positions: int = 0  # learned absolute position embeddings of the first N positions,
    # added to the token embeddings (Zoology's max_position_embeddings); 0 = none
    norm_eps: float = 1e-6
    dtype: str = "bfloat16"  # compute dtype of matmuls and activations
    param_dtype: str = "float32"
    # the kernel ops' settings values (kernels_pallas/<op>/settings.py), set from a run config
    # as --config.model.<field>.<setting>=... (e.g. model.gdn.wy_apply=triton); their
    # platform is kernel_platform's and the linear heads' chunk is la_chunk_size
    attention: AttentionSettings = AttentionSettings()  # softmax attention (FA heads)
    decode_attention: DecodeAttentionSettings = DecodeAttentionSettings()  # a decode step
    gdn: GDNSettings = GDNSettings()  # gated_delta_rule (GDN and DeltaNet heads)
    decay: DecaySettings = DecaySettings()  # decay_attention (the decaying-state kinds)
    hgrn: GatedRecurrenceSettings = GatedRecurrenceSettings()  # gated_recurrence (HGRN heads)
    conv: ShortConvSettings = ShortConvSettings()  # short_conv (convolution, SiLU, norm)
    norm: RMSNormSettings = RMSNormSettings()  # rms_norm (norms, residual adds)
    matmul: SkinnyMatmulSettings = SkinnyMatmulSettings()  # a decode step's projections
    la_chunk_size: int = 64  # chunk of every linear-head kind's chunked form
    la_kind: str = "gdn"  # the linear heads: a kind of hwh_jax/layers/heads/ (gdn,
    # deltanet, lightning, retnet, mamba2, gla, hgrn, hgrn2)
    la_short_conv: bool = False  # a short convolution on q, k, v of the kinds without
    # one (their HeadKind.conv_optional)
    kind_settings: tuple = ()  # ((kind, settings value), ...): the kernel settings of the
    # kinds that carry their own (HeadKind.settings), set as model.<kind>.<setting>
    remat: str = "none"  # what each block keeps for the backward pass: a policy of
    # layers/remat.py (none, save_dots, ..., full; "block" = full)
    kernel_platform: str = ""  # platform the kernels are chosen and lowered for
    # ("cpu" | "gpu" | "tpu"); "" = the default backend

    def __post_init__(self):
        if not self.layers:
            raise ValueError("ModelConfig.layers is empty")
        for name in (
            "vocab_size",
            "d_model",
            "num_heads",
            "head_dim",
            "la_key_dim",
            "la_value_dim",
            "q_per_kv",
            "conv_size",
            "la_chunk_size",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"ModelConfig.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("mlp_hidden", "abs_positions"):
            if getattr(self, name) < 0:
                raise ValueError(f"ModelConfig.{name} must be >= 0, got {getattr(self, name)}")
        for l, spec in enumerate(self.layers):
            if spec.num_fa % self.q_per_kv:
                raise ValueError(
                    f"layer {l}: {spec.num_fa} FA heads not divisible by q_per_kv={self.q_per_kv}"
                )
        for name, cls in KERNEL_SETTINGS.items():
            value = getattr(self, name)
            if not isinstance(value, cls):
                raise ValueError(
                    f"ModelConfig.{name} must be a {cls.__name__}, got {type(value).__name__}"
                )
            if "chunk_size" in SETTINGS_SET_HERE.get(name, ()) and value.chunk_size != getattr(
                cls, "chunk_size", value.chunk_size
            ):
                raise ValueError(
                    f"ModelConfig.{name}.chunk_size={value.chunk_size}: the chunk of every "
                    f"linear-head kind is model.la_chunk_size"
                )
            try:
                getattr(self, f"{name}_settings")()
            except ValueError as e:
                raise ValueError(f"ModelConfig.{name}: {e}") from None
        if self.rope_pairing not in PAIRINGS:
            raise ValueError(f"rope_pairing must be one of {PAIRINGS}, got {self.rope_pairing!r}")
        if any(s.fa_rope for s in self.layers) and self.head_dim % 2:
            raise ValueError(f"RoPE needs an even head_dim, got {self.head_dim}")
        kind = heads.get(self.la_kind)  # an unknown kind: an error listing the known ones
        own = heads.own_settings()
        for name, value in self.kind_settings:
            if name not in own:
                raise ValueError(
                    f"ModelConfig.kind_settings names {name!r}, which is not a linear-head kind "
                    f"with settings of its own; those are {sorted(own)}"
                )
            if not isinstance(value, own[name]):
                raise ValueError(
                    f"ModelConfig.kind_settings[{name!r}] must be a {own[name].__name__}, got "
                    f"{type(value).__name__}"
                )
        if self.la_short_conv and not kind.conv_optional:
            optional = [k for k in heads.names() if heads.get(k).conv_optional]
            raise ValueError(
                f"ModelConfig.la_short_conv adds a short convolution to the kinds "
                f"{optional}; la_kind={self.la_kind!r} "
                f"{'has no q, k' if not kind.uses_key_dim else 'has one already'}: "
                f"set model.la_short_conv=False"
            )
        if self.remat not in remat.POLICIES + tuple(remat.ALIASES):
            raise ValueError(
                f"ModelConfig.remat must be one of {list(remat.POLICIES)}, got {self.remat!r}"
            )
        for name in ("dtype", "param_dtype"):
            if getattr(self, name) not in DTYPES:
                raise ValueError(
                    f"ModelConfig.{name} must be one of {list(DTYPES)}, got {getattr(self, name)!r}"
                )

    def _kernel(self, name: str, **kw):
        """The settings value of field ``name`` with the platform (and chunk) set here."""
        value = getattr(self, name)
        return dataclasses.replace(
            value, platform=value.platform or self.kernel_platform or None, **kw
        )

    def kind_settings_for(self, name: str | None = None):
        """The settings value of linear-head kind ``name`` (default ``la_kind``) that carries
        its own (``HeadKind.settings``): the run's, else the defaults, with the platform and,
        where it has one, the chunk set here; None for a kind without settings of its own."""
        name = name or self.la_kind
        cls = heads.get(name).settings
        if cls is None:
            return None
        value = dict(self.kind_settings).get(name) or cls()
        kw = {"chunk_size": self.la_chunk_size} if hasattr(value, "chunk_size") else {}
        if hasattr(value, "platform"):
            kw["platform"] = value.platform or self.kernel_platform or None
        return dataclasses.replace(value, **kw)

    def attention_settings(self) -> AttentionSettings:
        return self._kernel("attention")

    def decode_attention_settings(self) -> DecodeAttentionSettings:
        return self._kernel("decode_attention")

    def gdn_settings(self) -> GDNSettings:
        return self._kernel("gdn", chunk_size=self.la_chunk_size)

    def decay_settings(self) -> DecaySettings:
        return self._kernel("decay", chunk_size=self.la_chunk_size)

    def hgrn_settings(self) -> GatedRecurrenceSettings:
        return self._kernel("hgrn")

    def conv_settings(self) -> ShortConvSettings:
        return self._kernel("conv")

    def norm_settings(self) -> RMSNormSettings:
        return self._kernel("norm")

    def matmul_settings(self) -> SkinnyMatmulSettings:
        return self._kernel("matmul")

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def compute_dtype(self):
        return DTYPES[self.dtype]

    @property
    def weight_dtype(self):
        return DTYPES[self.param_dtype]

    @property
    def fa_heads(self) -> tuple[int, ...]:
        return tuple(s.num_fa for s in self.layers)

    @property
    def la_heads(self) -> tuple[int, ...]:
        return tuple(s.num_la for s in self.layers)

    @property
    def fa_share(self) -> float:
        """FA heads over all heads of the model."""
        fa, la = sum(self.fa_heads), sum(self.la_heads)
        return fa / (fa + la)

    def replace(self, **kw) -> "ModelConfig":
        return dataclasses.replace(self, **settings_from(kw))
