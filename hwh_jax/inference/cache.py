"""Decode-cache memory per architecture and context: read off the cache's own shapes.

``init_cache`` is traced with ``jax.eval_shape`` (nothing is allocated), so the figure is exactly
what ``generate`` would hold: KV slots for FA heads (a ring of ``window`` slots for SWA heads),
fp32 state and short-conv tails for GDN heads.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from hwh_jax.layers.config import LA_KINDS, ModelConfig
from hwh_jax.layers.mixer import HeadwiseMixer
from hwh_jax.models.lm import HybridLM
from hwh_jax.models.params import param_table
from hwh_jax.models.variants import model_config


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


@functools.lru_cache(maxsize=1024)
def _layer_cache_bytes(cfg: ModelConfig, spec, context: int) -> int:
    """One layer's decode cache at batch 1 in bf16 (its mixer's ``init_cache`` shapes)."""
    mixer = nnx.eval_shape(lambda: HeadwiseMixer(cfg, spec, rngs=nnx.Rngs(0)))
    shapes = jax.eval_shape(lambda: mixer.init_cache(1, context, jnp.bfloat16))
    return sum(int(np.prod(x.shape)) * x.dtype.itemsize for x in jax.tree.leaves(shapes))


ZOO_ARCHS = ("gdn", "layerwise", "hwh")   # every head linear; 1 FA layer in 4; head-wise


def zoo_table(sizes=("small", "380m", "1b4"), context: int = 32768) -> str:
    """Markdown table: every linear-head kind (``model.la_kind``) pure (arch ``gdn``: every
    head linear), in the layer-wise 1:3 hybrid and as HwH's linear heads, at each size: total
    parameters, their difference from the Transformer's, the MLP width that matches them, and
    the decode cache at ``context`` tokens (batch 1, bf16 KV, fp32 states)."""
    lines = [f"| size | arch | linear heads | params | vs transformer | mlp hidden | "
             f"cache MiB at {context:,} |", "|---|---|---|---:|---:|---:|---:|"]
    for size in sizes:
        base = param_table(model_config("transformer", size))["total"]
        for kind in LA_KINDS:
            for arch in ZOO_ARCHS:
                cfg = model_config(arch, size, la_kind=kind)
                total = param_table(cfg)["total"]
                mib = sum(_layer_cache_bytes(cfg, spec, context)
                          for spec in cfg.layers) / 2 ** 20
                lines.append(f"| {size} | {arch} | {kind} | {total / 1e6:.2f}M | "
                             f"{100 * (total / base - 1):+.2f}% | {cfg.mlp_hidden} | {mib:,.1f} |")
    return "\n".join(lines)
