"""Kernels of hwh-jax. Each op is a package: ``reference.py`` (the specification in jnp), its
kernel file(s), ``settings.py`` (a frozen ``KernelSettings`` value: implementation, platform and
launch settings) and ``op.py`` (the public entry: shapes checked, implementation dispatched).
``chosen()`` tells which implementation each op ran."""

from kernels_pallas.attention import (
    AttentionSettings,
    DecodeAttentionSettings,
    attention,
    attention_reference,
    cached_attention,
    cached_attention_blockwise,
    decode_attention,
)
from kernels_pallas.decay_attention import DecaySettings, decay_attention
from kernels_pallas.dispatch import KernelSettings, chosen
from kernels_pallas.gated_recurrence import GatedRecurrenceSettings, gated_recurrence
from kernels_pallas.gdn import GDNSettings, gated_delta_rule, gated_delta_rule_step
from kernels_pallas.rms_norm import RMSNormSettings, rms_norm
from kernels_pallas.sharding import kernel_mesh
from kernels_pallas.short_conv import ShortConvSettings, short_conv
from kernels_pallas.skinny_matmul import SkinnyMatmulSettings, skinny_matmul
from kernels_pallas.softmax_xent import SoftmaxXentSettings, softmax_xent

__all__ = [
    "AttentionSettings",
    "DecaySettings",
    "DecodeAttentionSettings",
    "GDNSettings",
    "GatedRecurrenceSettings",
    "KernelSettings",
    "RMSNormSettings",
    "ShortConvSettings",
    "SkinnyMatmulSettings",
    "SoftmaxXentSettings",
    "attention",
    "attention_reference",
    "cached_attention",
    "cached_attention_blockwise",
    "chosen",
    "decode_attention",
    "gated_delta_rule",
    "gated_delta_rule_step",
    "decay_attention",
    "gated_recurrence",
    "kernel_mesh",
    "rms_norm",
    "short_conv",
    "skinny_matmul",
    "softmax_xent",
]
