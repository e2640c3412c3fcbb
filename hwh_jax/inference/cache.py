"""Decode-cache memory per architecture and context: read off the cache's own shapes.

``init_cache`` is traced with ``jax.eval_shape`` (nothing is allocated), so the figure is exactly
what ``generate`` would hold: KV slots for FA heads (a ring of ``window`` slots for SWA heads),
fp32 state and short-conv tails for GDN heads.
"""
from __future__ import annotations

import jax
import numpy as np
from flax import nnx

from hwh_jax.layers.config import ModelConfig
from hwh_jax.models.lm import HybridLM


def cache_bytes(cfg: ModelConfig, batch: int, context: int, dtype=None) -> dict:
    """{"fa": bytes, "la": bytes, "total": bytes} of the decode cache."""
    model = nnx.eval_shape(lambda: HybridLM(cfg, rngs=nnx.Rngs(0)))
    shapes = jax.eval_shape(lambda: model.init_cache(batch, context, dtype=dtype))
    out = {"fa": 0, "la": 0}
    for layer in shapes["layers"]:
        for kind in ("fa", "la"):
            for leaf in jax.tree.leaves(layer[kind]):
                out[kind] += int(np.prod(leaf.shape)) * leaf.dtype.itemsize
    out["total"] = out["fa"] + out["la"]
    return out


def cache_table(configs: dict[str, ModelConfig], contexts, batch: int = 1, dtype="bfloat16"):
    """Markdown table: decode-cache MiB per architecture (rows) and context (columns)."""
    head = "| arch | " + " | ".join(f"{c:,}" for c in contexts) + " |"
    lines = [head, "|---" * (len(contexts) + 1) + "|"]
    for name, cfg in configs.items():
        cells = [f"{cache_bytes(cfg, batch, c, dtype)['total'] / 2**20:,.1f}" for c in contexts]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
