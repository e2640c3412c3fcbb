"""Named per-layer head allocations: every architecture of the study as a tuple of LayerSpec.

transformer  all heads RoPE FA
gdn          all heads GDN
layerwise    whole layers alternate, ratio FA:GDN (default 1:3: layers 3, 7, 11, ... are FA)
swa          layer-wise, the GDN layers replaced by sliding-window RoPE FA (Qiao et al.)
hwh          in every layer n_fa(l) NoPE FA heads + (H - n_fa(l)) GDN heads; FA heads
             concentrated in the middle layers (a half-sine bump over depth, zero in the first
             and last layer), FA share < 25% (Shi, Yin, Li 2026, principles i and ii)
"""

from __future__ import annotations

import json
import math
import os

from hwh_jax.layers.config import LayerSpec

HWH_FA_SHARE = 0.1875  # 3/16 of all heads are FA: below the paper's 1:3 ceiling (25%)
RATIO = (1, 3)  # layerwise/swa: FA layers : other layers


def transformer(num_layers: int, num_heads: int) -> tuple[LayerSpec, ...]:
    return tuple(LayerSpec(num_heads, 0, fa_rope=True) for _ in range(num_layers))


def gdn(num_layers: int, num_heads: int) -> tuple[LayerSpec, ...]:
    return tuple(LayerSpec(0, num_heads) for _ in range(num_layers))


def _is_fa_layer(l: int, ratio: tuple[int, int]) -> bool:
    n_fa, n_la = ratio
    return l % (n_fa + n_la) >= n_la


def layerwise(num_layers: int, num_heads: int, ratio=RATIO, fa_rope: bool = True):
    _check_ratio(ratio, num_layers)
    return tuple(
        LayerSpec(num_heads, 0, fa_rope=fa_rope)
        if _is_fa_layer(l, ratio)
        else LayerSpec(0, num_heads)
        for l in range(num_layers)
    )


def swa(num_layers: int, num_heads: int, window: int, ratio=RATIO, fa_rope: bool = True):
    """Global FA layers (RoPE or NoPE) interleaved with RoPE sliding-window layers."""
    _check_ratio(ratio, num_layers)
    return tuple(
        LayerSpec(num_heads, 0, fa_rope=fa_rope)
        if _is_fa_layer(l, ratio)
        else LayerSpec(num_heads, 0, fa_rope=True, window=window)
        for l in range(num_layers)
    )


def _check_ratio(ratio, num_layers: int):
    if len(ratio) != 2 or min(ratio) < 0 or sum(ratio) == 0:
        raise ValueError(f"ratio must be (n_fa_layers, n_la_layers) >= 0, got {ratio}")
    if ratio[0] and not any(_is_fa_layer(l, ratio) for l in range(num_layers)):
        raise ValueError(
            f"model.ratio={tuple(ratio)} places its first FA layer after layer "
            f"{ratio[1]}, but the model has {num_layers} layers: no FA layer at "
            f"all; use a ratio with at most {num_layers - 1} other layers per FA "
            f"layer, or a size with more layers"
        )


def _largest_remainder(weights, total: int, unit: int, cap: int) -> list[int]:
    """Integer counts (multiples of ``unit``, each <= cap) summing to ``total``, ~ weights."""
    units = total // unit
    wsum = sum(weights)
    exact = [units * w / wsum for w in weights]
    counts = [min(math.floor(e), cap // unit) for e in exact]
    order = sorted(
        range(len(weights)),
        key=lambda i: (exact[i] - math.floor(exact[i]), weights[i]),
        reverse=True,
    )
    left = units - sum(counts)
    while left > 0:
        moved = False
        for i in order:
            if left and weights[i] > 0 and counts[i] < cap // unit:
                counts[i] += 1
                left -= 1
                moved = True
        if not moved:
            raise ValueError(
                f"cannot place {total} FA heads: every eligible layer is at its cap of {cap}"
            )
    return [c * unit for c in counts]


def hwh_counts(
    num_layers: int,
    num_heads: int,
    *,
    fa_share: float = HWH_FA_SHARE,
    placement: str = "middle",
    unit: int = 1,
) -> list[int]:
    """FA heads per layer. placement "middle": weight sin(pi l / (L-1)), zero at both ends;
    "uniform": equal weight on every layer (the paper's allocation ablation)."""
    if not 0 < fa_share < 1:
        raise ValueError(f"fa_share must lie in (0, 1), got {fa_share}")
    if placement == "middle":
        if num_layers < 3:
            raise ValueError(f"middle placement needs >= 3 layers, got {num_layers}")
        weights = [math.sin(math.pi * l / (num_layers - 1)) for l in range(num_layers)]
        weights[0] = weights[-1] = 0.0
    elif placement == "uniform":
        weights = [1.0] * num_layers
    else:
        raise ValueError(f"placement must be 'middle' or 'uniform', got {placement!r}")
    total = int(fa_share * num_layers * num_heads)
    return _largest_remainder(weights, total, unit, cap=num_heads // 2)


def load_counts(path: str) -> list[int]:
    """Per-layer FA head counts from a JSON file: a list, or {"fa_heads": [...]}. (The analysis
    tools write the latter from the retrieval heads of a trained RoPE model.)"""
    if not os.path.exists(path):
        raise FileNotFoundError(f"FA allocation file not found: {path}")
    with open(path) as f:
        data = json.load(f)
    counts = data["fa_heads"] if isinstance(data, dict) else data
    if not all(isinstance(c, int) for c in counts):
        raise ValueError(f"{path}: FA head counts must be integers, got {counts}")
    return list(counts)


def hwh(
    num_layers: int,
    num_heads: int,
    *,
    fa_share: float = HWH_FA_SHARE,
    placement: str = "middle",
    counts=None,
    fa_rope: bool = False,
    unit: int = 1,
    enforce_rules: bool = True,
) -> tuple[LayerSpec, ...]:
    """HwH layers. ``counts`` (list or JSON path) overrides the named placement.

    With ``enforce_rules`` the paper's rules are checked: FA share < 25% and no FA heads in the
    first and last layer (the uniform-allocation ablation turns this off on purpose)."""
    if isinstance(counts, str):
        counts = load_counts(counts)
    if counts is None:
        counts = hwh_counts(
            num_layers, num_heads, fa_share=fa_share, placement=placement, unit=unit
        )
    counts = list(counts)
    if len(counts) != num_layers:
        raise ValueError(f"hwh: {len(counts)} per-layer FA counts for {num_layers} layers")
    for l, c in enumerate(counts):
        if not 0 <= c <= num_heads:
            raise ValueError(f"hwh: layer {l} asks for {c} FA heads of {num_heads}")
    if enforce_rules:
        share = sum(counts) / (num_layers * num_heads)
        if share >= 0.25:
            raise ValueError(f"hwh: FA share {share:.3f} must stay below 0.25 (counts {counts})")
        if counts[0] or counts[-1]:
            raise ValueError(f"hwh: no FA heads allowed in the first/last layer, got {counts}")
    return tuple(LayerSpec(c, num_heads - c, fa_rope=fa_rope) for c in counts)
