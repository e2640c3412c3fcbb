"""The common body of the linear heads with a decaying state (Lightning, RetNet, Mamba-2, GLA,
HGRN-2: one module each beside this one). Not a kind itself.

Every such kind keeps a state h [K, V] per head and runs ``kernels_pallas.decay_attention``:
h <- diag(exp(g_t)) h + k_t v_t^T, o_t = h^T (scale q_t). A kind says where q, k, v and the log
decay g come from (``gates``) and what the output is (``out``, by default RMSNorm(o) *
SiLU(x W_g) per head over V); this class does the rest: the projections, the optional short
convolution, document starts (the decay at a document's first token is -80: the state
restarts, and no convolution reaches across documents), the chunked form for training and
prefill and the one-token step for decoding.

``short_conv=True`` (``ModelConfig.la_short_conv``) gives the kinds without a convolution one:
q, k, v = SiLU(ShortConv(.)) of their projections, as GDN's and Mamba-2's. Inference
(``init_cache`` / ``extend``): the fp32 state, and with a convolution the last W-1 inputs of it;
left padding (``valid`` False) writes nothing (k, v and g zeroed).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from flax import nnx

from hwh_jax.layers.heads.parts import RESET_LOG_DECAY, ShortConv, document_starts
from hwh_jax.layers.linear import dense
from hwh_jax.layers.norms import GatedRMSNorm
from hwh_jax.layers.variables import data
from kernels_pallas.decay_attention import (
    DecaySettings,
    decay_attention,
    decay_attention_step,
)
from kernels_pallas.short_conv import ShortConvSettings, causal_conv1d, silu_norm


class DecayHeads(nnx.Module):
    """``num_heads`` heads of one decaying-state kind over the normalised input. A kind
    subclasses it and defines ``gates(q, k, v, extra, positions, conv)``: (q, k [B, T, n, K],
    v [B, T, n, V], the log decay g in fp32, per head [B, T, n] or per key [B, T, n, K]) from
    the projections reshaped by head (``extra``: the output of its ``extra_projections()``,
    if any; ``conv``: q, k, v came through the short convolution, its SiLU applied); where it
    differs, it overrides the hooks below."""

    gated = True  # an output gate x W_g (HGRN-2: none)
    builtin_conv = False  # a short convolution on q, k, v always (Mamba-2)
    conv_on_k = True  # with a convolution, k convolved too (HGRN-2: k = 1 - f is the token's)

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        key_dim: int,
        value_dim: int,
        *,
        layer: int = 0,
        num_layers: int = 1,
        conv_size: int = 4,
        short_conv: bool = False,
        norm_eps: float = 1e-6,
        rope_theta: float = 10000.0,
        settings: DecaySettings | None = None,
        conv_settings: ShortConvSettings | None = None,
        dtype,
        param_dtype,
        rngs: nnx.Rngs,
    ):
        if short_conv and self.builtin_conv:
            raise ValueError(f"{type(self).__name__} has a short convolution already")
        self.num_heads, self.key_dim, self.value_dim = num_heads, key_dim, value_dim
        self.settings = DecaySettings() if settings is None else settings
        self.rope_theta, self.dtype = rope_theta, dtype
        self.layer, self.num_layers = layer, num_layers
        n, K, V = num_heads, key_dim, value_dim
        kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        names = ("embed", "heads")
        self.q_proj = dense(d_model, n * K, names, **kw)
        self.k_proj = dense(d_model, n * K, names, **kw)
        self.v_proj = dense(d_model, n * V, names, **kw)
        self.g_proj = data(dense(d_model, n * V, names, **kw) if self.gated else None)
        self.make_extra(d_model, kw)
        conv_kw = dict(settings=conv_settings, param_dtype=param_dtype, rngs=rngs)
        self.has_conv = self.builtin_conv or short_conv
        conv = self.has_conv
        self.q_conv = data(ShortConv(n * K, conv_size, **conv_kw) if conv else None)
        self.k_conv = data(
            ShortConv(n * K, conv_size, **conv_kw) if conv and self.conv_on_k else None
        )
        self.v_conv = data(ShortConv(n * V, conv_size, **conv_kw) if conv else None)
        self.make_params(param_dtype, rngs)
        self.o_norm = self.make_norm(norm_eps, param_dtype)

    # ------------------------------------------------------------ what a kind overrides
    def make_extra(self, d_model: int, kw: dict) -> None:
        """Projections of a kind's own beyond q, k, v and the gate (made in this order, after
        them: the parameters' random keys follow the order of creation)."""

    def extra_projections(self) -> tuple:
        """Those projections, in the order ``gates`` takes their outputs (as ``extra``)."""
        return ()

    def make_params(self, param_dtype, rngs) -> None:
        """Parameters of a kind's own that are not projections (after the convolutions)."""

    def make_norm(self, norm_eps: float, param_dtype):
        """The output norm: per head over V with the gate (``out``)."""
        return GatedRMSNorm(self.value_dim, eps=norm_eps, dtype=self.dtype, param_dtype=param_dtype)

    def out(self, o, gate, skip):
        """The heads' outputs [B, T, n*V] in the compute dtype from o [B, T, n, V]."""
        B, T = o.shape[:2]
        n, V = self.num_heads, self.value_dim
        return self.o_norm(o, gate.reshape(B, T, n, V)).reshape(B, T, n * V)

    @property
    def scale(self) -> float:
        return self.key_dim**-0.5

    # ------------------------------------------------------------ the common body
    def projections(self):
        """The input projections, in the order ``mix`` takes their outputs."""
        gate = (self.g_proj,) if self.g_proj is not None else ()
        return (self.q_proj, self.k_proj, self.v_proj, *gate, *self.extra_projections())

    def projection_heads(self):
        """Heads in each projection's output (None: not split by head), for sharding."""
        n = self.num_heads
        own = {id(p) for p in (self.q_proj, self.k_proj, self.v_proj, self.g_proj)}
        return [n if id(p) in own else self.extra_heads(p) for p in self.projections()]

    def extra_heads(self, proj):
        """Heads in the output of one of ``extra_projections()`` (None: not split by head)."""
        return self.num_heads

    def __call__(self, x, positions=None, segment_ids=None):
        return self.mix(
            *(p(x) for p in self.projections()), segment_ids=segment_ids, positions=positions
        )

    def _unpack(self, proj):
        q, k, v = proj[:3]
        rest = list(proj[3:])
        gate = rest.pop(0) if self.g_proj is not None else None
        extra = rest.pop(0) if rest else None
        return q, k, v, gate, extra

    def _heads(self, q, k, v, extra, positions, convs=None):
        """(q, k, v, g, skip) by head from the projections; ``convs``: q, k, v after the
        convolutions (``has_conv``). ``skip``: what ``out`` adds beside o (Mamba-2's D x)."""
        B, T, _ = q.shape
        n, K, V = self.num_heads, self.key_dim, self.value_dim
        conv = convs is not None
        if conv:
            q, k, v = convs
        q, k, v = q.reshape(B, T, n, K), k.reshape(B, T, n, K), v.reshape(B, T, n, V)
        q, k, v, g = self.gates(q, k, v, extra, positions, conv)
        return q, k, v, g, None

    def _convs(self):
        """The convolutions of q, k, v (None where that input has none)."""
        return self.q_conv, self.k_conv, self.v_conv

    # ------------------------------------------------------------ training / prefill
    def mix(self, *proj, segment_ids=None, positions=None):
        """The heads' outputs [B, T, n*V] from the input's projections (``projections()``)."""
        q, k, v, gate, extra = self._unpack(proj)
        B, T, _ = q.shape
        if positions is None:
            positions = jnp.arange(T)[None]
        convs = None
        if self.has_conv:
            convs = tuple(
                x if c is None else c(x, segment_ids) for x, c in zip((q, k, v), self._convs())
            )
        q, k, v, g, skip = self._heads(q, k, v, extra, positions, convs)
        if segment_ids is not None:
            start = document_starts(segment_ids)
            g = jnp.where(start.reshape(*start.shape, *([1] * (g.ndim - 2))), RESET_LOG_DECAY, g)
        o, _ = decay_attention(q, k, v, g, scale=self.scale, settings=self.settings)
        return self.out(o, gate, skip)

    # ------------------------------------------------------------ inference
    def init_cache(self, batch: int, dtype):
        n, K, V = self.num_heads, self.key_dim, self.value_dim
        cache = {"state": jnp.zeros((batch, n, K, V), jnp.float32)}
        if self.has_conv:
            W, C = self.q_conv.kernel.shape[0], sum(c.kernel.shape[1] for c in self._convs() if c)
            cache["conv"] = jnp.zeros((batch, W - 1, C), dtype)
        return cache

    def extend(self, proj, valid, cache, *, t0=0, start=None):
        """proj: the input's projections (``projections()``) at times t0 .. t0+Tn-1 [B, Tn,
        width], valid [B, Tn] bool, start [B] (left-padding slots) -> (outputs [B, Tn, n*V],
        updated cache)."""
        q, k, v, gate, extra = self._unpack(proj)
        B, Tn, _ = q.shape
        start = jnp.zeros((B,), jnp.int32) if start is None else start
        positions = jnp.maximum(t0 + jnp.arange(Tn, dtype=jnp.int32)[None] - start[:, None], 0)
        new = {}
        convs = None
        if self.has_conv:  # every convolution as one, over its inputs side by side
            ins = [x for x, c in zip((q, k, v), self._convs()) if c is not None]
            x = jnp.concatenate(ins, axis=-1) * valid[..., None].astype(q.dtype)
            window = cache["conv"]
            xp = jnp.concatenate([window.astype(x.dtype), x], axis=1)
            w = jnp.concatenate([c.kernel[...] for c in self._convs() if c is not None], axis=1)
            z = silu_norm(causal_conv1d(xp, w)[:, window.shape[1] :])
            outs = iter(jnp.split(z, np.cumsum([a.shape[-1] for a in ins])[:-1], axis=-1))
            convs = tuple(x if c is None else next(outs) for x, c in zip((q, k, v), self._convs()))
            new["conv"] = xp[:, xp.shape[1] - window.shape[1] :]
        q, k, v, g, skip = self._heads(q, k, v, extra, positions, convs)
        keep = valid[..., None, None]
        k, v = jnp.where(keep, k, 0).astype(k.dtype), jnp.where(keep, v, 0).astype(v.dtype)
        g = jnp.where(valid.reshape(*valid.shape, *([1] * (g.ndim - 2))), g, 0.0)
        if Tn == 1:
            o, state = decay_attention_step(
                q[:, 0], k[:, 0], v[:, 0], g[:, 0], cache["state"], scale=self.scale
            )
            o = o[:, None]
        else:
            o, state = decay_attention(
                q,
                k,
                v,
                g,
                scale=self.scale,
                settings=self.settings,
                initial_state=cache["state"],
                output_final_state=True,
            )
        new["state"] = state
        return self.out(o, gate, skip), new


def build(cls):
    """A kind's ``HeadKind.build`` for its ``DecayHeads`` subclass ``cls``."""

    def build(cfg, num_heads, layer, **kw):
        return cls(
            cfg.d_model,
            num_heads,
            cfg.la_key_dim,
            cfg.la_value_dim,
            layer=layer,
            num_layers=cfg.num_layers,
            conv_size=cfg.conv_size,
            short_conv=cfg.la_short_conv,
            norm_eps=cfg.norm_eps,
            rope_theta=cfg.rope_theta,
            settings=cfg.decay_settings(),
            conv_settings=cfg.conv_settings(),
            **kw,
        )

    return build


def decay_flops(cfg) -> float:
    """Training FLOPs a token and head of the decaying-state chunked form: intra-chunk scores
    and values, 2C(K+V), and the state's read and write, 4KV, for chunk C; times 3 for the
    backward."""
    C, K, V = cfg.la_chunk_size, cfg.la_key_dim, cfg.la_value_dim
    return 3.0 * (2 * C * (K + V) + 4 * K * V)
