"""The memory floor of a decode step: the bytes one token's step must move, and the time that
takes at the device's peak memory bandwidth.

A step of B tokens reads every weight once (the matrices in the compute dtype, as ``Generator``
holds them; of an untied embedding table only the B rows looked up), reads the whole allocated
FA cache (cached attention runs over every slot and masks by position) and writes one slot of
it, and reads and rewrites every linear-attention state. No implementation moves fewer bytes,
so ``bytes / bandwidth`` bounds the step's time from below; a step near it is bound by memory,
one far above it by launches or compute (``bench/decode.py`` prints the ratio).
"""

from __future__ import annotations

import jax
import numpy as np
from flax import nnx

from hwh_jax.inference.cache import cache_bytes
from hwh_jax.inference.generate import matrices_in
from hwh_jax.layers.config import ModelConfig
from hwh_jax.models.lm import HybridLM

# Peak memory bandwidth (bytes/s) by device kind prefix: the vendors' figures. A copy kernel
# reaches about 90% of it on an H200 (4.27 of 4.8 TB/s).
PEAK_MEMORY_BANDWIDTH = {
    "NVIDIA H200": 4.8e12,
    "NVIDIA H100 80GB HBM3": 3.35e12,
    "NVIDIA H100": 3.35e12,
    "NVIDIA A100-SXM4-80GB": 2.039e12,
    "NVIDIA A100-SXM4-40GB": 1.555e12,
    "TPU v4": 1.2e12,
    "TPU v5 lite": 0.819e12,
    "TPU v5e": 0.819e12,
    "TPU v5p": 2.765e12,
    "TPU v5": 2.765e12,
    "TPU v6 lite": 1.64e12,
    "TPU v6e": 1.64e12,
}


def peak_memory_bandwidth(device_kind: str) -> float | None:
    """Bytes/s of ``device_kind`` (``jax.devices()[0].device_kind``), None when unknown."""
    for name, peak in PEAK_MEMORY_BANDWIDTH.items():
        if device_kind.startswith(name):
            return peak
    return None


def decode_step_bytes(state, cfg: ModelConfig, batch: int, context: int) -> dict:
    """{"weights", "cache_read", "cache_written", "total"}: bytes one decode step of ``batch``
    tokens moves with the parameters ``state`` (a pytree of arrays or shapes, as the decoder
    holds them) and a cache of ``context`` slots (``cache_bytes``)."""
    leaves = jax.tree.leaves(state)
    weights = sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize for x in leaves)
    if not cfg.tie_embeddings:  # the table is only looked up: B rows, not all of it
        weights -= (cfg.vocab_size - batch) * cfg.d_model * np.dtype(cfg.compute_dtype).itemsize
    cache = cache_bytes(cfg, batch, context)
    one_slot = cache["fa"] // context
    return {
        "weights": weights,
        "cache_read": cache["total"],
        "cache_written": one_slot + cache["la"],
        "total": weights + cache["total"] + one_slot + cache["la"],
    }


def floor_ms(step_bytes: float, bandwidth: float | None) -> float | None:
    """Milliseconds to move ``step_bytes`` at ``bandwidth`` bytes/s (None without one)."""
    return None if not bandwidth else 1e3 * step_bytes / bandwidth


def held_weights(cfg: ModelConfig):
    """The parameters' shapes as the decoder holds them (matrices in the compute dtype, as
    ``Generator``), without allocating them."""
    _, state = nnx.split(nnx.eval_shape(lambda: HybridLM(cfg, rngs=nnx.Rngs(0))))
    return jax.eval_shape(lambda s: matrices_in(s, cfg.compute_dtype), state)


def floor_table(configs: dict[str, ModelConfig], context: int, batches, bandwidth: float) -> str:
    """Markdown table: GB a decode step moves and its floor in ms at ``bandwidth`` bytes/s, per
    architecture (rows) and batch (columns), at ``context``."""
    head = "| arch | " + " | ".join(f"batch {b}: GB | ms" for b in batches) + " |"
    lines = [head, "|---" * (2 * len(batches) + 1) + "|"]
    for name, cfg in configs.items():
        weights = held_weights(cfg)
        cells = []
        for b in batches:
            total = decode_step_bytes(weights, cfg, b, context)["total"]
            cells.append(f"{total / 1e9:.3f} | {floor_ms(total, bandwidth):.3f}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
