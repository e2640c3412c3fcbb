"""Model family: config, schedules, sizes, the LM itself and parameter counting."""

from hwh_jax.layers.config import LayerSpec, ModelConfig
from hwh_jax.models.lm import HybridLM
from hwh_jax.models.params import count_params, count_params_whole, param_table
from hwh_jax.models.variants import ARCHS, SIZES, model_config

__all__ = [
    "ARCHS",
    "SIZES",
    "HybridLM",
    "LayerSpec",
    "ModelConfig",
    "count_params",
    "count_params_whole",
    "model_config",
    "param_table",
]
