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

from hwh_jax.layers import heads
from hwh_jax.layers.config import ModelConfig
from hwh_jax.layers.mixer import HeadwiseMixer
from hwh_jax.models.params import param_table
from hwh_jax.models.variants import model_config


def cache_bytes(cfg: ModelConfig, batch: int, context: int, dtype=None) -> dict:
    """{"fa": bytes, "la": bytes, "total": bytes} of the decode cache: the layers' caches
    (``HybridLM.init_cache``'s; its two [batch] int32 counters are left out), each layer's read
    off one traced mixer, shared by the layers of the same head split (a table of every
    architecture at four contexts in seconds, not the minute that tracing whole models took)."""
    dtype = jnp.dtype(cfg.compute_dtype if dtype is None else dtype).name
    out = {"fa": 0, "la": 0}
    for spec in cfg.layers:
        fa, la = _layer_cache(cfg, spec, batch, context, dtype)
        out["fa"], out["la"] = out["fa"] + fa, out["la"] + la
    out["total"] = out["fa"] + out["la"]
    return out


@functools.lru_cache(maxsize=4096)
def _layer_cache(cfg: ModelConfig, spec, batch: int, context: int, dtype: str):
    """(FA bytes, linear-head bytes) of one layer's decode cache (its mixer's ``init_cache``)."""
    mixer = _abstract_mixer(cfg, spec)
    shapes = jax.eval_shape(lambda: mixer.init_cache(batch, context, jnp.dtype(dtype)))
    return tuple(
        sum(int(np.prod(x.shape)) * x.dtype.itemsize for x in jax.tree.leaves(shapes[kind]))
        for kind in ("fa", "la")
    )


@functools.lru_cache(maxsize=256)
def _abstract_mixer(cfg: ModelConfig, spec):
    return nnx.eval_shape(lambda: HeadwiseMixer(cfg, spec, rngs=nnx.Rngs(0)))


def cache_table(configs: dict[str, ModelConfig], contexts, batch: int = 1, dtype="bfloat16"):
    """Markdown table: decode-cache MiB per architecture (rows) and context (columns)."""
    head = "| arch | " + " | ".join(f"{c:,}" for c in contexts) + " |"
    lines = [head, "|---" * (len(contexts) + 1) + "|"]
    for name, cfg in configs.items():
        cells = [f"{cache_bytes(cfg, batch, c, dtype)['total'] / 2**20:,.1f}" for c in contexts]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


ZOO_ARCHS = ("gdn", "layerwise", "hwh")  # every head linear; 1 FA layer in 4; head-wise


def zoo_table(sizes=("small", "380m", "1b4"), context: int = 32768) -> str:
    """Markdown table: every linear-head kind (``model.la_kind``) pure (arch ``gdn``: every
    head linear), in the layer-wise 1:3 hybrid and as HwH's linear heads, at each size: total
    parameters, their difference from the Transformer's, the MLP width that matches them, and
    the decode cache at ``context`` tokens (batch 1, bf16 KV, fp32 states)."""
    lines = [
        f"| size | arch | linear heads | params | vs transformer | mlp hidden | "
        f"cache MiB at {context:,} |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for size in sizes:
        base = param_table(model_config("transformer", size))["total"]
        for kind in heads.names():
            for arch in ZOO_ARCHS:
                cfg = model_config(arch, size, la_kind=kind)
                total = param_table(cfg)["total"]
                mib = cache_bytes(cfg, 1, context, "bfloat16")["total"] / 2**20
                lines.append(
                    f"| {size} | {arch} | {kind} | {total / 1e6:.2f}M | "
                    f"{100 * (total / base - 1):+.2f}% | {cfg.mlp_hidden} | {mib:,.1f} |"
                )
    return "\n".join(lines)
