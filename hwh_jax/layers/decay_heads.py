"""Linear-attention heads with a decaying state: Lightning, RetNet, Mamba-2, GLA and HGRN-2, as
the linear heads of a layer (``ModelConfig.la_kind``), beside FA heads or alone.

Every kind keeps a state h [K, V] per head and runs ``kernels_pallas.decay_attention``:
h <- diag(exp(g_t)) h + k_t v_t^T, o_t = h^T (scale q_t). The kinds differ in where q, k, v and
the log decay g come from and in the output (n heads, key dim K, value dim V, x the normalised
input):

  lightning  q, k = SiLU(x W_q), SiLU(x W_k); v = x W_v; g = -2^(-8 (h+1) / n), fixed per head
             (ALiBi's slopes); out = RMSNorm(o) * SiLU(x W_g)
  retnet     q, k = RoPE(x W_q), RoPE(x W_k); v = x W_v; g = log(1 - 2^(-5-h)), fixed per head;
             out = RMSNorm(o) * SiLU(x W_g)                        (multi-scale retention)
  mamba2     q = C, k = B, x' = SiLU(ShortConv(.)) of x W_C, x W_B, x W_x; dt = softplus(x W_dt +
             dt_bias); g = -exp(A_log) dt per head; v = x' dt; o += D x'; scale 1;
             out = RMSNorm(o * SiLU(x W_z))                         (SSD, gate after the norm's input)
  gla        q, k, v = x W_q, x W_k, x W_v; g = logsigmoid(x W_1 W_2 + b) / 16 per key (a
             rank-16 gate); out = RMSNorm(o) * SiLU(x W_g)
  hgrn2      q = SiLU(x W_q); f = lb + (1 - lb) sigmoid(x W_f) per key, k = 1 - f, g = log f;
             v = x W_i; out = RMSNorm over all heads (no gate). lb, the forget gate's lower
             bound, rises with depth: layer / num_layers (fixed; HGRN learns it)

``short_conv=True`` (``ModelConfig.la_short_conv``) gives the kinds without a convolution one:
q, k, v = SiLU(ShortConv(.)) of their projections, as GDN's and Mamba-2's, the convolution's SiLU
taking the place of Lightning's and HGRN-2's own on q and k; HGRN-2's forget gate stays the
token's own (its k = 1 - f is not convolved), RetNet rotates the convolved q and k.

The norms are per head over V (weight shared by the heads, as GDN's) except HGRN-2's. With
segment ids the decay at a document's first token is -80 (the state restarts) and no
convolution reaches across documents. Inference (``init_cache`` / ``extend``): the fp32
state, and with a convolution the last W-1 inputs of it; left padding (``valid`` False)
writes nothing (k, v and g zeroed).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from hwh_jax.layers.config import LA_CONV_OPTIONAL
from hwh_jax.layers.gdn import RESET_LOG_DECAY, ShortConv, _a_log_init, _dt_bias_init
from hwh_jax.layers.linear import dense
from hwh_jax.layers.norms import GatedRMSNorm, RMSNorm
from hwh_jax.layers.rope import apply_rope
from hwh_jax.layers.variables import data, partitioned
from kernels_pallas.decay_attention import (
    DecaySettings,
    gated_linear_attention,
    gated_linear_attention_step,
)
from kernels_pallas.short_conv import ShortConvSettings, causal_conv1d, silu_norm

KINDS = ("lightning", "retnet", "mamba2", "gla", "hgrn2")
GLA_RANK, GLA_NORMALIZER = 16, 16.0


def fixed_log_decay(kind: str, num_heads: int):
    """Lightning's and RetNet's per-head log decay [n] (fp32)."""
    h = jnp.arange(num_heads, dtype=jnp.float32)
    if kind == "lightning":
        return -(2.0 ** (-8.0 * (h + 1) / num_heads))
    return jnp.log1p(-(2.0 ** (-5.0 - h)))


class DecayLinearHeads(nnx.Module):
    """``num_heads`` heads of one ``kind`` (module docstring) over the normalised input."""

    def __init__(
        self,
        kind: str,
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
        if kind not in KINDS:
            raise ValueError(f"linear-head kind must be one of {KINDS}, got {kind!r}")
        if short_conv and kind not in LA_CONV_OPTIONAL:
            raise ValueError(
                f"short_conv adds a convolution to {LA_CONV_OPTIONAL}; {kind!r} has one already"
            )
        if kind == "retnet" and key_dim % 2:
            raise ValueError(f"retnet heads rotate q and k: la_key_dim must be even, got {key_dim}")
        self.kind, self.num_heads, self.key_dim, self.value_dim = (
            kind,
            num_heads,
            key_dim,
            value_dim,
        )
        self.settings = DecaySettings() if settings is None else settings
        self.rope_theta, self.dtype = rope_theta, dtype
        self.lower_bound = layer / num_layers if kind == "hgrn2" else 0.0
        n, K, V = num_heads, key_dim, value_dim
        kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        names = ("embed", "heads")
        self.q_proj = dense(d_model, n * K, names, **kw)
        self.k_proj = dense(d_model, n * K, names, **kw)  # hgrn2: the forget gate f
        self.v_proj = dense(d_model, n * V, names, **kw)
        self.g_proj = data_or_none(kind != "hgrn2", lambda: dense(d_model, n * V, names, **kw))
        self.gk_down = data_or_none(
            kind == "gla", lambda: dense(d_model, GLA_RANK, ("embed", None), **kw)
        )
        self.gk_up = data_or_none(
            kind == "gla", lambda: dense(GLA_RANK, n * K, (None, "heads"), use_bias=True, **kw)
        )
        mamba = kind == "mamba2"
        self.dt_proj = data_or_none(mamba, lambda: dense(d_model, n, names, **kw))
        conv_kw = dict(settings=conv_settings, param_dtype=param_dtype, rngs=rngs)
        self.has_conv = mamba or short_conv
        self.q_conv = data_or_none(self.has_conv, lambda: ShortConv(n * K, conv_size, **conv_kw))
        self.k_conv = data_or_none(
            self.has_conv and kind != "hgrn2", lambda: ShortConv(n * K, conv_size, **conv_kw)
        )
        self.v_conv = data_or_none(self.has_conv, lambda: ShortConv(n * V, conv_size, **conv_kw))
        if mamba:
            self.A_log = nnx.Param(
                partitioned(_a_log_init, ("heads",))(rngs.params(), (n,), param_dtype)
            )
            self.dt_bias = nnx.Param(
                partitioned(_dt_bias_init, ("heads",))(rngs.params(), (n,), param_dtype)
            )
            self.D = nnx.Param(
                partitioned(nnx.initializers.ones_init(), ("heads",))(
                    rngs.params(), (n,), param_dtype
                )
            )
        if kind == "hgrn2":
            self.o_norm = RMSNorm(
                n * V, eps=norm_eps, dtype=jnp.float32, param_dtype=param_dtype, axis_name="heads"
            )
        elif mamba:
            self.o_norm = RMSNorm(V, eps=norm_eps, dtype=jnp.float32, param_dtype=param_dtype)
        else:
            self.o_norm = GatedRMSNorm(V, eps=norm_eps, dtype=dtype, param_dtype=param_dtype)

    def projections(self):
        """The input projections, in the order ``mix`` takes their outputs."""
        extra = {"gla": (self.gk_down,), "mamba2": (self.dt_proj,)}.get(self.kind, ())
        gate = (self.g_proj,) if self.g_proj is not None else ()
        return (self.q_proj, self.k_proj, self.v_proj, *gate, *extra)

    def projection_heads(self):
        """Heads in each projection's output (None: not split by head), for sharding."""
        n = self.num_heads
        return [n if p is not self.gk_down else None for p in self.projections()]

    def __call__(self, x, positions=None, segment_ids=None):
        return self.mix(
            *(p(x) for p in self.projections()), segment_ids=segment_ids, positions=positions
        )

    # ------------------------------------------------------------ the pieces
    def _unpack(self, proj):
        q, k, v = proj[:3]
        rest = list(proj[3:])
        gate = rest.pop(0) if self.g_proj is not None else None
        extra = rest.pop(0) if rest else None
        return q, k, v, gate, extra

    def _heads(self, q, k, v, extra, positions, convs=None):
        """q, k [B, T, n, K], v [B, T, n, V] and the log decay (scalar [B, T, n] or per key
        [B, T, n, K], fp32) from the projections; ``convs``: q, k, v after the convolutions
        (``has_conv``)."""
        B, T, _ = q.shape
        n, K, V = self.num_heads, self.key_dim, self.value_dim
        f32 = jnp.float32
        kind = self.kind
        if kind == "mamba2":
            q, k, v = convs
            dt = jax.nn.softplus(extra.astype(f32) + self.dt_bias[...].astype(f32))
            g = -jnp.exp(self.A_log[...].astype(f32)) * dt  # [B, T, n]
            q, k = q.reshape(B, T, n, K), k.reshape(B, T, n, K)
            x = v.reshape(B, T, n, V)
            return q, k, (x.astype(f32) * dt[..., None]).astype(x.dtype), g, x
        conv = convs is not None
        if conv:
            q, k, v = convs
        q, k, v = q.reshape(B, T, n, K), k.reshape(B, T, n, K), v.reshape(B, T, n, V)
        if kind == "lightning":
            if not conv:
                q, k = jax.nn.silu(q), jax.nn.silu(k)
            g = jnp.broadcast_to(fixed_log_decay(kind, n), (B, T, n))
        elif kind == "retnet":
            q = apply_rope(q, positions, theta=self.rope_theta)
            k = apply_rope(k, positions, theta=self.rope_theta)
            g = jnp.broadcast_to(fixed_log_decay(kind, n), (B, T, n))
        elif kind == "gla":
            low = self.gk_up(extra).reshape(B, T, n, K).astype(f32)
            g = jax.nn.log_sigmoid(low) / GLA_NORMALIZER
        else:  # hgrn2
            f = jax.nn.sigmoid(k.astype(f32))
            f = self.lower_bound + (1.0 - self.lower_bound) * f
            q = q if conv else jax.nn.silu(q)
            k, g = (1.0 - f).astype(k.dtype), jnp.log(f)
        return q, k, v, g, None

    def _out(self, o, gate, skip):
        """The heads' outputs [B, T, n*V] in the compute dtype from o [B, T, n, V]."""
        B, T = o.shape[:2]
        n, V = self.num_heads, self.value_dim
        if self.kind == "mamba2":
            o = o.astype(jnp.float32) + self.D[...].astype(jnp.float32)[:, None] * skip.astype(
                jnp.float32
            )
            o = o * jax.nn.silu(gate.reshape(B, T, n, V).astype(jnp.float32))
            return self.o_norm(o).astype(self.dtype).reshape(B, T, n * V)
        if self.kind == "hgrn2":
            return self.o_norm(o.reshape(B, T, n * V)).astype(self.dtype)
        return self.o_norm(o, gate.reshape(B, T, n, V)).reshape(B, T, n * V)

    @property
    def scale(self) -> float:
        return 1.0 if self.kind == "mamba2" else self.key_dim**-0.5

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
            start = jnp.concatenate(
                [
                    jnp.zeros_like(segment_ids[:, :1], bool),
                    segment_ids[:, 1:] != segment_ids[:, :-1],
                ],
                axis=1,
            )
            g = jnp.where(start.reshape(*start.shape, *([1] * (g.ndim - 2))), RESET_LOG_DECAY, g)
        o, _ = gated_linear_attention(q, k, v, g, scale=self.scale, settings=self.settings)
        return self._out(o, gate, skip)

    # ------------------------------------------------------------ inference
    def init_cache(self, batch: int, dtype):
        n, K, V = self.num_heads, self.key_dim, self.value_dim
        cache = {"state": jnp.zeros((batch, n, K, V), jnp.float32)}
        if self.has_conv:
            W, C = self.q_conv.kernel.shape[0], sum(c.kernel.shape[1] for c in self._convs() if c)
            cache["conv"] = jnp.zeros((batch, W - 1, C), dtype)
        return cache

    def _convs(self):
        """The convolutions of q, k, v (None where that input has none)."""
        return self.q_conv, self.k_conv, self.v_conv

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
            o, state = gated_linear_attention_step(
                q[:, 0], k[:, 0], v[:, 0], g[:, 0], cache["state"], scale=self.scale
            )
            o = o[:, None]
        else:
            o, state = gated_linear_attention(
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
        return self._out(o, gate, skip), new


def data_or_none(present: bool, make):
    """``make()`` when ``present``, else an empty (None) slot the module keeps as data."""
    return data(make() if present else None)
