"""Model sizes (a table of rows) and architectures (named schedules), combined into ModelConfig.

Fair comparison at equal parameters: depth L, width d, head slots per layer H and head dims are
the same for every architecture of a size. A GDN head costs more than an FA head (q, k, v *and*
an output gate W_g of V columns, plus small a/b/conv/A_log/dt_bias terms: about 4dD + 2d against
3dD for an MHA head with K = V = D), so an architecture whose mixers are heavier than the
Transformer's gets a narrower SwiGLU: its hidden width is the Transformer's minus the mean extra
mixer parameters per layer over 3d, rounded to a multiple of 64. Total parameters then match the
Transformer's to well under 1% (docs/models.md lists every count).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from hwh_jax.layers.config import ModelConfig, settings_from
from hwh_jax.models import schedules
from hwh_jax.models.params import mixer_params


@dataclasses.dataclass(frozen=True)
class Size:
    """One row of the sizes table: the widths every architecture of that size shares."""

    d_model: int
    num_layers: int
    num_heads: int
    head_dim: int
    mlp_hidden: int  # the Transformer's SwiGLU width; other architectures are matched to it
    vocab_size: int
    swa_window: int  # default window of the SWA hybrid's local layers


VOCAB_GPT2 = 50304  # GPT-2's 50257 tokens padded to a multiple of 64 for efficient matmuls

SIZES = {
    #          d     L   H   D    mlp   vocab        window
    "tiny": Size(128, 4, 8, 16, 384, 4096, 64),  # CPU: trains in minutes
    "small": Size(640, 12, 10, 64, 1728, VOCAB_GPT2, 512),  # ~92M, single-GPU experiments
    "380m": Size(1024, 24, 16, 64, 3072, VOCAB_GPT2, 512),
    "1b4": Size(2048, 24, 16, 128, 6144, VOCAB_GPT2, 512),
}


@dataclasses.dataclass(frozen=True)
class Layout:
    """What an architecture's allocation may read besides depth and head slots: the run
    config's ``model.fa_share``, ``counts``, ``ratio``, ``window`` and ``q_per_kv``."""

    fa_share: float
    counts: object
    ratio: tuple
    window: int
    q_per_kv: int


@dataclasses.dataclass(frozen=True)
class Architecture:
    """One architecture: ``layers(num_layers, num_heads, layout)`` allocates its heads per
    layer (a list of ``LayerSpec``, ``schedules``' named allocations)."""

    name: str
    layers: Callable[[int, int, Layout], list]
    about: str = ""


_ARCHS: dict[str, Architecture] = {}


def register_arch(arch: Architecture) -> Architecture:
    """Add an architecture under its name (``model.arch``); a name taken twice is an error."""
    if arch.name in _ARCHS:
        raise ValueError(f"architecture {arch.name!r} is registered twice")
    _ARCHS[arch.name] = arch
    return arch


def _hwh(placement, fa_rope):
    def layers(L, H, o: Layout):
        uniform = placement == "uniform"
        return schedules.hwh(
            L,
            H,
            fa_share=o.fa_share,
            counts=o.counts,
            placement=placement,
            fa_rope=fa_rope,
            unit=o.q_per_kv,
            enforce_rules=not uniform,
        )

    return layers


for _arch in (
    Architecture("transformer", lambda L, H, o: schedules.transformer(L, H), "RoPE FA heads"),
    Architecture("gdn", lambda L, H, o: schedules.gdn(L, H), "linear heads only"),
    Architecture(
        "layerwise",
        lambda L, H, o: schedules.layerwise(L, H, o.ratio, fa_rope=True),
        "FA layers (RoPE) among linear layers at model.ratio",
    ),
    Architecture(
        "layerwise_nope",
        lambda L, H, o: schedules.layerwise(L, H, o.ratio, fa_rope=False),
        "layerwise, NoPE FA layers",
    ),
    Architecture(
        "swa",
        lambda L, H, o: schedules.swa(L, H, o.window, o.ratio, fa_rope=True),
        "FA layers (RoPE) among sliding-window layers",
    ),
    Architecture(
        "swa_nope",
        lambda L, H, o: schedules.swa(L, H, o.window, o.ratio, fa_rope=False),
        "swa, NoPE FA layers",
    ),
    Architecture("hwh", _hwh("middle", False), "head-wise: NoPE FA heads beside linear heads"),
    Architecture("hwh_rope", _hwh("middle", True), "hwh with RoPE FA heads"),
    Architecture("hwh_uniform", _hwh("uniform", False), "hwh, FA heads spread evenly"),
):
    register_arch(_arch)
ARCHS = tuple(_ARCHS)  # the project's architectures, in the tables' order


def build_layers(
    arch: str,
    num_layers: int,
    num_heads: int,
    *,
    fa_share=None,
    counts=None,
    ratio=schedules.RATIO,
    window=512,
    q_per_kv: int = 1,
):
    """The layers of architecture ``arch`` (a registered name) at depth and head slots."""
    if arch not in _ARCHS:
        raise ValueError(f"unknown architecture {arch!r}; known: {tuple(_ARCHS)}")
    fa_share = schedules.HWH_FA_SHARE if fa_share is None else fa_share
    layout = Layout(fa_share, counts, tuple(ratio), window, q_per_kv)
    return _ARCHS[arch].layers(num_layers, num_heads, layout)


def matched_mlp_hidden(cfg: ModelConfig, base: ModelConfig, multiple: int = 64) -> int:
    """SwiGLU width that gives ``cfg`` the parameter count of ``base`` (same d and L)."""
    extra = sum(mixer_params(cfg, s) for s in cfg.layers) - sum(
        mixer_params(base, s) for s in base.layers
    )
    hidden = base.mlp_hidden - extra / (3 * cfg.d_model * cfg.num_layers)
    return max(multiple, int(round(hidden / multiple)) * multiple)


def model_config(
    arch: str,
    size: str,
    *,
    fa_share=None,
    counts=None,
    ratio=schedules.RATIO,
    window=None,
    num_layers=None,
    match_params: bool = True,
    **overrides,
) -> ModelConfig:
    """ModelConfig of architecture ``arch`` at size ``size`` (``num_layers``: another depth at
    the size's widths, None = the size's); ``overrides`` replace fields (dtype, q_per_kv,
    qk_norm, rope_theta, vocab_size, gdn=GDNSettings(...) or a mapping of its settings, ...)."""
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; known: {list(SIZES)}")
    s = SIZES[size]
    if num_layers is not None:
        if num_layers < 1:
            raise ValueError(f"model.num_layers must be >= 1 (0: the size's), got {num_layers}")
        s = dataclasses.replace(s, num_layers=num_layers)
    q_per_kv = overrides.get("q_per_kv", 1)
    layers = build_layers(
        arch,
        s.num_layers,
        s.num_heads,
        fa_share=fa_share,
        counts=counts,
        ratio=tuple(ratio),
        window=window or s.swa_window,
        q_per_kv=q_per_kv,
    )
    fields = dict(
        vocab_size=s.vocab_size,
        d_model=s.d_model,
        num_heads=s.num_heads,
        head_dim=s.head_dim,
        la_key_dim=s.head_dim,
        la_value_dim=s.head_dim,
        mlp_hidden=s.mlp_hidden,
        layers=layers,
        arch=arch,
    )
    fields.update(settings_from(overrides))
    cfg = ModelConfig(**fields)
    if match_params and "mlp_hidden" not in overrides and arch != "transformer":
        base = cfg.replace(
            layers=schedules.transformer(s.num_layers, s.num_heads), mlp_hidden=s.mlp_hidden
        )
        cfg = cfg.replace(mlp_hidden=matched_mlp_hidden(cfg, base))
    if cfg.la_kind != "gdn" and sum(cfg.la_heads):  # the name shown: "gla", "hwh/gla",
        kind = cfg.la_kind + ("+conv" if cfg.la_short_conv else "")  # "hwh/gla+conv"
        cfg = cfg.replace(arch=kind if arch == "gdn" else f"{arch}/{kind}")
    return cfg


RENAMED = {"gdn_chunk_size": "la_chunk_size"}  # old model.* key -> its name now


def model_config_from_dict(m) -> ModelConfig:
    """ModelConfig from the ``model`` section of a run config (any mapping; 0/"" = default)."""
    m = dict(m)
    for old, new in RENAMED.items():  # run configs written before a field was renamed
        if old in m:
            m.setdefault(new, m.pop(old))
    counts = m.pop("counts", "") or None
    if isinstance(counts, str) and not counts.endswith(".json"):
        try:
            counts = [int(c) for c in counts.split(",")]
        except ValueError:
            raise ValueError(
                f"model.counts must be comma-separated ints or a .json path, got {counts!r}"
            ) from None
    arch, size = m.pop("arch"), m.pop("size")
    kw = dict(
        fa_share=m.pop("fa_share", None),
        counts=counts,
        ratio=tuple(m.pop("ratio", schedules.RATIO)),
        window=m.pop("window", 0) or None,
        num_layers=m.pop("num_layers", 0) or None,
    )
    if not m.get("vocab_size"):
        m.pop("vocab_size", None)
    return model_config(arch, size, **kw, **m)
