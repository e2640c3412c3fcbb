"""Gated DeltaNet heads (Yang et al., ICLR 2025), as fla's GatedDeltaNet layer builds them.

For n heads with key dim K and value dim V, from the normalised input x [B, T, d]:

    q, k, v  = SiLU(ShortConv_4(x W_q)), SiLU(ShortConv_4(x W_k)), SiLU(ShortConv_4(x W_v))
    q, k     = q / |q| K**-0.5, k / |k|                   (per head)
    beta_t   = sigmoid(x W_b)                             [B, T, n]
    g_t      = -exp(A_log) * softplus(x W_a + dt_bias)    [B, T, n]  (log alpha_t <= 0)
    o        = gated_delta_rule(q, k, v, g, beta)         (kernels_pallas.gdn; state fp32)
    out      = RMSNorm(o) * SiLU(x W_g)                   per head over V

ShortConv_4 is a causal depthwise convolution of width 4; it, its SiLU and the norm of q and k
are one op, ``kernels_pallas.short_conv`` (Pallas kernels on GPU). ``A_log`` and ``dt_bias`` are
per head and carry no weight decay (the optimizer's mask reads their names). With segment ids
the convolution does not reach across documents and the recurrence restarts at each document.

Inference (``init_cache`` / ``extend``): the fp32 state [B, n, K, V] plus the last W-1 projected
inputs of q, k and v (one window for the three convolutions). Left padding (``valid`` False) is
made invisible: the padded inputs are zeroed before the convolution and their beta and g are 0,
so the state stays at zero.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

import kernels_pallas
from hwh_jax.layers.heads import HeadKind, register
from hwh_jax.layers.heads.parts import (
    RESET_LOG_DECAY,
    ShortConv,
    a_log_init,
    document_starts,
    dt_bias_init,
)
from hwh_jax.layers.linear import dense
from hwh_jax.layers.norms import GatedRMSNorm
from hwh_jax.layers.variables import data, partitioned
from kernels_pallas.gdn import GDNSettings
from kernels_pallas.short_conv import ShortConvSettings, causal_conv1d, silu_norm


class GatedDeltaNetHeads(nnx.Module):
    """``num_heads`` Gated DeltaNet heads over the normalised input x [B, T, d] (module
    docstring for the formulas), n heads, key dim K, value dim V; ``decay=False``: DeltaNet
    (Yang et al., 2024), the same heads without the decay (no W_a, A_log, dt_bias; g = 0):

    1. Project: q, k [B, T, n*K], v, gate [B, T, n*V], a, b [B, T, n] (``projections()``; the
       mixer computes them for all its heads at once).
    2. Short convolutions with SiLU: q and k L2-normalised per head, q times K**-0.5
       (``ShortConv``) -> q, k [B, T, n, K], v [B, T, n, V].
    3. Gates (``gates``): beta = sigmoid(b), g = -exp(A_log) softplus(a + dt_bias) [B, T, n],
       g set to -80 at a document's first token (the state restarts).
    4. The gated delta rule over time (``kernels_pallas.gated_delta_rule``, the state
       [B, n, K, V] in fp32) -> o [B, T, n, V].
    5. Gated norm: RMSNorm(o) * SiLU(gate) per head over V -> [B, T, n*V].
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        key_dim: int,
        value_dim: int,
        *,
        conv_size: int = 4,
        norm_eps: float = 1e-6,
        decay: bool = True,
        settings: GDNSettings | None = None,
        conv_settings: ShortConvSettings | None = None,
        dtype,
        param_dtype,
        rngs: nnx.Rngs,
    ):
        self.num_heads, self.key_dim, self.value_dim = num_heads, key_dim, value_dim
        self.decay = decay
        self.settings = GDNSettings() if settings is None else settings
        self.dtype = dtype
        kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.q_proj = dense(d_model, num_heads * key_dim, ("embed", "heads"), **kw)
        self.k_proj = dense(d_model, num_heads * key_dim, ("embed", "heads"), **kw)
        self.v_proj = dense(d_model, num_heads * value_dim, ("embed", "heads"), **kw)
        self.g_proj = dense(d_model, num_heads * value_dim, ("embed", "heads"), **kw)
        self.a_proj = data(dense(d_model, num_heads, ("embed", "heads"), **kw) if decay else None)
        self.b_proj = dense(d_model, num_heads, ("embed", "heads"), **kw)
        conv_kw = dict(settings=conv_settings, param_dtype=param_dtype, rngs=rngs)
        self.q_conv = ShortConv(num_heads * key_dim, conv_size, **conv_kw)
        self.k_conv = ShortConv(num_heads * key_dim, conv_size, **conv_kw)
        self.v_conv = ShortConv(num_heads * value_dim, conv_size, **conv_kw)
        if decay:
            a_init = partitioned(a_log_init, ("heads",))
            dt_init = partitioned(dt_bias_init, ("heads",))
            self.A_log = nnx.Param(a_init(rngs.params(), (num_heads,), param_dtype))
            self.dt_bias = nnx.Param(dt_init(rngs.params(), (num_heads,), param_dtype))
        self.o_norm = GatedRMSNorm(value_dim, eps=norm_eps, dtype=dtype, param_dtype=param_dtype)

    def projections(self):
        """The input projections, in the order ``mix`` takes their outputs: the order in which
        the layer has always used them, so that the backward sums their input gradients in the
        same order and training stays bitwise what it was."""
        if not self.decay:
            return (self.q_proj, self.k_proj, self.v_proj, self.b_proj, self.g_proj)
        return (self.q_proj, self.k_proj, self.v_proj, self.b_proj, self.a_proj, self.g_proj)

    def projection_heads(self):
        """Heads in each projection's output, for sharding."""
        return [self.num_heads] * len(self.projections())

    def _unpack(self, proj):
        """(q, k, v, b, a or None, gate) from ``projections()``' outputs."""
        if self.decay:
            return proj
        q, k, v, b, gate = proj
        return q, k, v, b, None, gate

    def gates(self, a, b, segment_ids=None):
        """beta [B,T,n] and log decay g [B,T,n], fp32, from the projections a = x W_a and
        b = x W_b. DeltaNet (``a`` None) has no decay: g None, which the GDN op runs without
        exponentials, except in packed documents, where g is 0 but at each document start."""
        beta = jax.nn.sigmoid(b.astype(jnp.float32))
        if a is None:
            if segment_ids is None:
                return beta, None
            g = jnp.zeros_like(beta)
        else:
            a = a.astype(jnp.float32) + self.dt_bias[...].astype(jnp.float32)
            g = -jnp.exp(self.A_log[...].astype(jnp.float32)) * jax.nn.softplus(a)
        if segment_ids is not None:
            g = jnp.where(document_starts(segment_ids)[..., None], RESET_LOG_DECAY, g)
        return beta, g

    def __call__(self, x, segment_ids=None):
        return self.mix(*(p(x) for p in self.projections()), segment_ids=segment_ids)

    def mix(self, *proj, segment_ids=None, positions=None):
        """The heads' outputs [B, T, n*V] from the input's projections (``projections()``);
        ``positions`` unused (the heads are position-free)."""
        del positions
        q, k, v, b, a, gate = self._unpack(proj)
        B, T, _ = q.shape
        n, K, V = self.num_heads, self.key_dim, self.value_dim
        # the query scale K**-0.5 is applied by q's normalising pass, not by a pass of its own
        # in the GDN op
        q = self.q_conv(q, segment_ids, heads=n, normalize=True, scale=K**-0.5)
        q = q.reshape(B, T, n, K)
        k = self.k_conv(k, segment_ids, heads=n, normalize=True).reshape(B, T, n, K)
        v = self.v_conv(v, segment_ids, heads=n).reshape(B, T, n, V)
        beta, g = self.gates(a, b, segment_ids)
        o, _ = kernels_pallas.gated_delta_rule(q, k, v, g, beta, scale=1.0, settings=self.settings)
        return self.o_norm(o, gate.reshape(B, T, n, V)).reshape(B, T, n * V)

    # ------------------------------------------------------------ inference
    def init_cache(self, batch: int, dtype):
        n, K, V = self.num_heads, self.key_dim, self.value_dim
        W = self.q_conv.kernel.shape[0]
        return {
            "state": jnp.zeros((batch, n, K, V), jnp.float32),
            "conv": jnp.zeros((batch, W - 1, n * (2 * K + V)), dtype),
        }

    def extend(self, proj, valid, cache, *, t0=0, start=None):
        """proj: the input's projections (in the order of ``projections()``) [B, Tn, width],
        valid [B, Tn] bool -> (heads' outputs [B, Tn, n*V], updated cache).

        q, k and v share one convolution window (the last W-1 inputs, [B, W-1, n*(2K+V)]): one
        concatenation and one convolution where there were three (the convolution is depthwise,
        so the values are those of three). The barrier keeps XLA from fusing the projection
        into the window's concatenation, which at one token it does as a slow reduction of one
        thread per column (docs/benchmarks.md)."""
        del t0, start  # position-free
        q, k, v, b, a, gate = self._unpack(proj)
        B, Tn, _ = q.shape
        n, K, V = self.num_heads, self.key_dim, self.value_dim
        x = jnp.concatenate([q, k, v], axis=-1) * valid[..., None].astype(q.dtype)
        x = jax.lax.optimization_barrier(x)
        window = cache["conv"]
        xp = jnp.concatenate([window.astype(x.dtype), x], axis=1)
        w = jnp.concatenate(
            [c.kernel[...] for c in (self.q_conv, self.k_conv, self.v_conv)], axis=1
        )
        z = causal_conv1d(xp, w)[:, window.shape[1] :]
        q = silu_norm(z[..., : n * K], heads=n, normalize=True).reshape(B, Tn, n, K)
        k = silu_norm(z[..., n * K : 2 * n * K], heads=n, normalize=True).reshape(B, Tn, n, K)
        v = silu_norm(z[..., 2 * n * K :]).reshape(B, Tn, n, V)
        beta, g = self.gates(a, b)
        g = jnp.zeros_like(beta) if g is None else g
        beta, g = jnp.where(valid[..., None], beta, 0.0), jnp.where(valid[..., None], g, 0.0)
        if Tn == 1:
            o, state = kernels_pallas.gated_delta_rule_step(
                q[:, 0],
                k[:, 0],
                v[:, 0],
                g[:, 0],
                beta[:, 0],
                cache["state"],
                settings=self.settings,
            )
            o = o[:, None]
        else:
            o, state = kernels_pallas.gated_delta_rule(
                q,
                k,
                v,
                g,
                beta,
                initial_state=cache["state"],
                output_final_state=True,
                settings=self.settings,
            )
        out = self.o_norm(o, gate.reshape(B, Tn, n, V)).reshape(B, Tn, n * V)
        return out, {"state": state, "conv": xp[:, xp.shape[1] - window.shape[1] :]}


def _build(decay: bool):
    def build(cfg, num_heads, layer, **kw):
        del layer  # the same at every depth
        return GatedDeltaNetHeads(
            cfg.d_model,
            num_heads,
            cfg.la_key_dim,
            cfg.la_value_dim,
            conv_size=cfg.conv_size,
            norm_eps=cfg.norm_eps,
            decay=decay,
            settings=cfg.gdn_settings(),
            conv_settings=cfg.conv_settings(),
            **kw,
        )

    return build


def delta_rule_flops(cfg) -> float:
    """Training FLOPs a token and head of the chunked WY form: its forward, 4C(K+V) + 6KV for
    chunk C (ANCHORS.md: 8CD + 6D^2 at K = V = D), times 3 for the backward."""
    C, K, V = cfg.la_chunk_size, cfg.la_key_dim, cfg.la_value_dim
    return 3.0 * (4 * C * (K + V) + 6 * K * V)


register(
    HeadKind(
        "gdn",
        _build(decay=True),
        delta_rule_flops,
        about="gated delta rule: S <- a_t (I - b_t k k^T) S + b_t k v^T",
        no_decay=("A_log", "dt_bias"),
        torch_form=True,
    )
)
register(
    HeadKind(
        "deltanet",
        _build(decay=False),
        delta_rule_flops,
        about="delta rule: S <- (I - b_t k k^T) S + b_t k v^T",
        torch_form=True,
    )
)
