"""Kernels of hwh-jax: each op has a pure-jnp reference (the spec) and a dispatcher."""
from kernels_pallas.attention import (attention, attention_reference, cached_attention,
                                      cached_attention_blockwise)
from kernels_pallas.dispatch import chosen
from kernels_pallas.gdn import gated_delta_rule, gated_delta_rule_step
from kernels_pallas.sharding import kernel_mesh

__all__ = ["attention", "attention_reference", "cached_attention", "cached_attention_blockwise",
           "chosen", "gated_delta_rule", "gated_delta_rule_step", "kernel_mesh"]
