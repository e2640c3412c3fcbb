"""Parameter counts from shapes alone (``nnx.eval_shape``: no weights are allocated).

A model is counted block by block, each distinct LayerSpec once, so that counting the 1.4B
configs takes well under a second; tests check the sum against the whole model's eval_shape.
"""

from __future__ import annotations

import functools

import jax
import numpy as np
from flax import nnx

from hwh_jax.layers.config import LayerSpec, ModelConfig
from hwh_jax.layers.mixer import HeadwiseMixer
from hwh_jax.models.lm import HybridLM


def _count(abstract_module) -> int:
    state = nnx.state(abstract_module, nnx.Param)
    return int(sum(np.prod(x.shape) for x in jax.tree.leaves(state)))


def mixer_params(cfg: ModelConfig, spec: LayerSpec) -> int:
    """Parameters of one layer's token mixer (FA heads, GDN heads, output projection)."""
    # a mixer reads neither the other layers (only their number), nor the name, the MLP or the
    # vocabulary: configs that differ only there share one count
    return _mixer_params(
        cfg.replace(layers=(spec,) * cfg.num_layers, arch="", mlp_hidden=1, vocab_size=1), spec
    )


@functools.lru_cache(maxsize=512)
def _mixer_params(cfg: ModelConfig, spec: LayerSpec) -> int:
    return _count(nnx.eval_shape(lambda: HeadwiseMixer(cfg, spec, rngs=nnx.Rngs(0))))


def count_params(cfg: ModelConfig) -> int:
    """All parameters of HybridLM(cfg); a tied embedding counts once."""
    return sum(param_table(cfg)[k] for k in ("embedding", "mixers", "mlps", "norms"))


def count_params_whole(cfg: ModelConfig) -> int:
    """The same count from one eval_shape of the whole model (slower; the check of the above)."""
    return _count(nnx.eval_shape(lambda: HybridLM(cfg, rngs=nnx.Rngs(0))))


def param_table(cfg: ModelConfig) -> dict[str, int]:
    """{'embedding', 'mixers', 'mlps', 'norms', 'total', 'non_embedding'} parameter counts."""
    d = cfg.d_model
    emb = cfg.vocab_size * d * (1 if cfg.tie_embeddings else 2) + cfg.abs_positions * d
    mix = sum(mixer_params(cfg, s) for s in cfg.layers)
    mlp = 3 * d * cfg.mlp_hidden * cfg.num_layers
    norms = d * ((2 if cfg.mlp_hidden else 1) * cfg.num_layers + 1)
    total = emb + mix + mlp + norms
    return {
        "embedding": emb,
        "mixers": mix,
        "mlps": mlp,
        "norms": norms,
        "total": total,
        "non_embedding": total - emb,
    }
