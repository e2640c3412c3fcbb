"""hwh-jax: head-wise hybrid (NoPE full attention + Gated DeltaNet) language models in JAX."""
import flax

# Weights carry logical axis names as metadata only; the trainer maps them onto a mesh through
# one rules table (hwh_jax.training.sharding). Flax >= 0.12 would otherwise try to shard every
# annotated variable eagerly at creation and demand a mesh even on one CPU.
try:
    flax.config.update("flax_always_shard_variable", False)
except (AttributeError, KeyError, ValueError):  # older flax: no eager sharding to turn off
    pass

__version__ = "0.1.0"
