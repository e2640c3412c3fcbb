"""Pieces several linear-head kinds share: the short causal convolution (GDN, DeltaNet,
Mamba-2, and the others' ``la_short_conv``), where documents start in packed rows, and Mamba's
initialisers of the per-head decay (GDN, Mamba-2). Not a kind itself."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from hwh_jax.layers.variables import partitioned
from kernels_pallas.short_conv import ShortConvSettings, short_conv

RESET_LOG_DECAY = -80.0  # g at a document start: alpha = e^-80 ~ 2e-35 wipes the state


def document_starts(segment_ids):
    """[B, T] bool: True where a token starts a new document of a packed row (not at t = 0,
    where every state is empty anyway)."""
    return jnp.concatenate(
        [jnp.zeros_like(segment_ids[:, :1], bool), segment_ids[:, 1:] != segment_ids[:, :-1]],
        axis=1,
    )


class ShortConv(nnx.Module):
    """A causal depthwise convolution of ``width`` taps over ``channels``, its SiLU and, for q
    and k, the per-head L2 norm: one ``kernels_pallas.short_conv`` op, weight [width, channels].
    """

    def __init__(
        self,
        channels: int,
        width: int,
        *,
        settings: ShortConvSettings | None = None,
        param_dtype,
        rngs: nnx.Rngs,
    ):
        init = partitioned(conv_init, ("conv", "heads"))
        self.kernel = nnx.Param(init(rngs.params(), (width, channels), param_dtype))
        self.settings = ShortConvSettings() if settings is None else settings

    def __call__(
        self, x, segment_ids=None, *, heads: int = 1, normalize: bool = False, scale: float = 1.0
    ):
        """SiLU(conv(x)) [B, T, C], L2-normalised per head and times ``scale`` if ``normalize``
        (``kernels_pallas.short_conv``)."""
        return short_conv(
            x,
            self.kernel[...],
            segment_ids,
            heads=heads,
            normalize=normalize,
            scale=scale,
            settings=self.settings,
        )


def conv_init(key, shape, dtype):
    bound = 1.0 / math.sqrt(shape[0])  # PyTorch Conv1d default for a depthwise kernel
    return jax.random.uniform(key, shape, dtype, -bound, bound)


def dt_bias_init(key, shape, dtype, dt_min=1e-3, dt_max=0.1, floor=1e-4):
    """Inverse-softplus of dt ~ logUniform[dt_min, dt_max] (Mamba / fla initialisation)."""
    u = jax.random.uniform(key, shape)
    dt = jnp.maximum(jnp.exp(u * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min)), floor)
    return (dt + jnp.log(-jnp.expm1(-dt))).astype(dtype)


def a_log_init(key, shape, dtype):
    return jnp.log(jax.random.uniform(key, shape, minval=1.0, maxval=16.0)).astype(dtype)
