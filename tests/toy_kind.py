"""A linear-head kind kept outside the package, as a researcher would add one: this module is
all of it. Each head keeps an exponential moving average of its values, h_t = d h_{t-1} +
(1 - d) v_t with v = x W_v, and outputs h (the state restarts at each document). It runs on the
HGRN recurrence's kernel op, with kernel settings of its own (``EMASettings``: the decay d and
the op's implementation), which a run sets as ``--config.model.toy_ema.decay=0.25``.
tests/models/test_head_kinds.py names it in $HWH_HEAD_KINDS and trains, decodes and describes a
model built with ``model.la_kind = "toy_ema"``."""

import dataclasses

import jax.numpy as jnp
from flax import nnx

from hwh_jax.layers.heads import HeadKind, register
from hwh_jax.layers.heads.parts import document_starts
from hwh_jax.layers.linear import dense
from kernels_pallas.gated_recurrence import GatedRecurrenceSettings, gated_recurrence


@dataclasses.dataclass(frozen=True)
class EMASettings:
    """The toy kind's kernel settings: the moving average's decay and how its recurrence runs."""

    decay: float = 0.5  # weight of the previous state, in [0, 1)
    impl: str = "auto"  # gated_recurrence's implementation
    platform: str | None = None  # filled in by ModelConfig (kernel_platform)
    interpret: bool = False

    def __post_init__(self):
        if not 0.0 <= self.decay < 1.0:
            raise ValueError(f"decay must be in [0, 1), got {self.decay}")

    def recurrence(self) -> GatedRecurrenceSettings:
        return GatedRecurrenceSettings(
            impl=self.impl, platform=self.platform, interpret=self.interpret
        )


class EMAHeads(nnx.Module):
    def __init__(self, cfg, num_heads, *, dtype, param_dtype, rngs):
        self.num_heads, self.dtype = num_heads, dtype
        self.settings = cfg.kind_settings_for("toy_ema")
        width = num_heads * cfg.la_value_dim
        names = ("embed", "heads")  # sharding: the input's width, then the heads
        self.v_proj = dense(
            cfg.d_model, width, names, dtype=dtype, param_dtype=param_dtype, rngs=rngs
        )

    def projections(self):
        return (self.v_proj,)

    def projection_heads(self):
        return [self.num_heads]

    def mix(self, v, segment_ids=None, positions=None):
        d = self.settings.decay
        a = jnp.full(v.shape, d, jnp.float32)
        if segment_ids is not None:
            a = jnp.where(document_starts(segment_ids)[..., None], 0.0, a)
        h, _ = gated_recurrence(
            a, (1 - d) * v.astype(jnp.float32), settings=self.settings.recurrence()
        )
        return h.astype(self.dtype)

    def init_cache(self, batch, dtype):
        width = self.v_proj.kernel.shape[1]
        return {"state": jnp.zeros((batch, width), jnp.float32)}

    def extend(self, proj, valid, cache, *, t0=0, start=None):
        (v,) = proj
        d = self.settings.decay
        keep = valid[..., None]  # left padding: a = 1, b = 0 keep the state
        a = jnp.where(keep, d, 1.0).astype(jnp.float32) * jnp.ones(v.shape, jnp.float32)
        b = jnp.where(keep, (1 - d) * v.astype(jnp.float32), 0.0)
        h, state = gated_recurrence(
            a,
            b,
            initial_state=cache["state"],
            output_final_state=True,
            settings=self.settings.recurrence(),
        )
        return h.astype(self.dtype), {"state": state}


register(
    HeadKind(
        "toy_ema",
        lambda cfg, num_heads, layer, **kw: EMAHeads(cfg, num_heads, **kw),
        lambda cfg: 3.0 * 3 * cfg.la_value_dim,  # a multiply and an add a channel, x3 backward
        about="a moving average of the values (a test's toy)",
        uses_key_dim=False,
        settings=EMASettings,
    )
)
