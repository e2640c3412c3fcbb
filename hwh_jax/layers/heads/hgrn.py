"""HGRN heads (Qin et al., 2023, "Hierarchically gated recurrent neural network"): an element-wise
gated linear recurrence as the linear heads of a layer (``ModelConfig.la_kind = "hgrn"``), beside
FA heads or alone. n heads of V channels each, x the normalised input:

  i = x W_i, f = lb + (1 - lb) sigmoid(x W_f), g = x W_g
  h_t = f_t * h_{t-1} + (1 - f_t) * SiLU(i_t)          (per channel: a vector state [n, V])
  out = RMSNorm(h) * SiLU(g)                            (per head over V, weight shared)

lb, the forget gate's lower bound, rises with depth: layer / num_layers (fixed, as for HGRN-2
in hgrn2.py; HGRN learns it). There is no key dimension and no outer product: the state is
V numbers a head, and ``model.la_key_dim`` is unused. The recurrence runs as
``kernels_pallas.gated_recurrence`` (``model.hgrn.impl``: by default its Pallas kernels on GPUs,
the associative scan elsewhere). With segment ids the gate at a document's first token is 0
(the state restarts). Inference: the fp32 state; left padding (``valid`` False) keeps it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from hwh_jax.layers.heads import HeadKind, register
from hwh_jax.layers.heads.parts import document_starts
from hwh_jax.layers.linear import dense
from hwh_jax.layers.norms import GatedRMSNorm
from kernels_pallas.gated_recurrence import (
    GatedRecurrenceSettings,
    gated_recurrence,
    gated_recurrence_step,
)


class HGRNHeads(nnx.Module):
    """``num_heads`` HGRN heads of ``value_dim`` channels over the normalised input."""

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        value_dim: int,
        *,
        layer: int = 0,
        num_layers: int = 1,
        norm_eps: float = 1e-6,
        settings: GatedRecurrenceSettings | None = None,
        dtype,
        param_dtype,
        rngs: nnx.Rngs,
    ):
        self.num_heads, self.value_dim, self.dtype = num_heads, value_dim, dtype
        self.settings = GatedRecurrenceSettings() if settings is None else settings
        self.lower_bound = layer / num_layers
        n, V = num_heads, value_dim
        kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        names = ("embed", "heads")
        self.i_proj = dense(d_model, n * V, names, **kw)
        self.f_proj = dense(d_model, n * V, names, **kw)
        self.g_proj = dense(d_model, n * V, names, **kw)
        self.o_norm = GatedRMSNorm(V, eps=norm_eps, dtype=dtype, param_dtype=param_dtype)

    def projections(self):
        """The input projections, in the order ``mix`` takes their outputs."""
        return (self.i_proj, self.f_proj, self.g_proj)

    def projection_heads(self):
        """Heads in each projection's output, for sharding."""
        return [self.num_heads] * 3

    def __call__(self, x, positions=None, segment_ids=None):
        return self.mix(
            *(p(x) for p in self.projections()), segment_ids=segment_ids, positions=positions
        )

    def _gates(self, i, f):
        """(a, b) [B, T, n*V] fp32 of the recurrence h = a h + b."""
        f = jax.nn.sigmoid(f.astype(jnp.float32))
        f = self.lower_bound + (1.0 - self.lower_bound) * f
        return f, (1.0 - f) * jax.nn.silu(i.astype(jnp.float32))

    def _out(self, h, g):
        B, T = h.shape[:2]
        n, V = self.num_heads, self.value_dim
        o = self.o_norm(h.astype(self.dtype).reshape(B, T, n, V), g.reshape(B, T, n, V))
        return o.reshape(B, T, n * V)

    def mix(self, i, f, g, segment_ids=None, positions=None):
        """The heads' outputs [B, T, n*V] from the input's projections (``projections()``)."""
        del positions  # HGRN has no positions
        a, b = self._gates(i, f)
        if segment_ids is not None:
            a = jnp.where(document_starts(segment_ids)[..., None], 0.0, a)
        h, _ = gated_recurrence(a, b, settings=self.settings)
        return self._out(h, g)

    def init_cache(self, batch: int, dtype):
        del dtype  # the state is fp32
        return {"state": jnp.zeros((batch, self.num_heads * self.value_dim), jnp.float32)}

    def extend(self, proj, valid, cache, *, t0=0, start=None):
        """proj: the input's projections at times t0 .. t0+Tn-1 [B, Tn, width], valid [B, Tn]
        bool -> (outputs [B, Tn, n*V], updated cache). Invalid (left-padding) slots keep the
        state: a = 1, b = 0 there."""
        del t0, start
        i, f, g = proj
        a, b = self._gates(i, f)
        keep = valid[..., None]
        a, b = jnp.where(keep, a, 1.0), jnp.where(keep, b, 0.0)
        if i.shape[1] == 1:
            state = gated_recurrence_step(a[:, 0], b[:, 0], cache["state"])
            h = state[:, None]
        else:
            h, state = gated_recurrence(
                a, b, initial_state=cache["state"], output_final_state=True, settings=self.settings
            )
        return self._out(h, g), {"state": state}


def build(cfg, num_heads, layer, **kw):
    return HGRNHeads(
        cfg.d_model,
        num_heads,
        cfg.la_value_dim,
        layer=layer,
        num_layers=cfg.num_layers,
        norm_eps=cfg.norm_eps,
        settings=cfg.hgrn_settings(),
        **kw,
    )


register(
    HeadKind(
        "hgrn",
        build,
        lambda cfg: 3.0 * 4 * cfg.la_value_dim,  # element-wise: a few FLOPs a channel
        about="element-wise gated recurrence: h <- f h + (1 - f) SiLU(i), a vector state",
        uses_key_dim=False,
    )
)
