"""Inference: batched prefill + decode over per-layer caches, sampling, cache memory."""

from hwh_jax.inference.cache import cache_bytes, cache_table, zoo_table
from hwh_jax.inference.generate import Generator, generate
from hwh_jax.inference.sampling import sample

__all__ = ["Generator", "generate", "sample", "cache_bytes", "cache_table", "zoo_table"]
