"""hwh-jax's language models in PyTorch: softmax-attention heads beside linear-attention heads
in one layer (``HwhForCausalLM``, loaded by ``transformers`` with ``trust_remote_code=True``).

    h_0 = Embed(tokens) [+ learned positions]
    h_l = h_{l-1} + W_o [ FA_1..n_fa(x) ; LA_1..n_la(x) ],  x = RMSNorm(h_{l-1})
    h_l = h_l + SwiGLU(RMSNorm(h_l))                       (when intermediate_size > 0)
    logits = RMSNorm(h_L) W_head                            (tied to the embedding by default)

FA heads: q, k, v projections, optional per-head RMSNorm of q and k, RoPE or none (NoPE), GQA,
causal softmax attention, an optional sliding window. LA heads (``config.la_kind``):

    gdn        S_t = a_t (I - b_t k_t k_t^T) S_{t-1} + b_t v_t k_t^T,  o_t = S_t q_t   (Gated DeltaNet)
    deltanet   the same with a_t = 1
    lightning  S_t = e^{g_h} S_{t-1} + v_t k_t^T, g_h = -2^(-8(h+1)/n); q, k through SiLU
    retnet     S_t = e^{g_h} S_{t-1} + v_t k_t^T, g_h = log(1 - 2^(-5-h)); q, k rotated

each with its output RMSNorm(o) * SiLU(x W_g) per head. GDN and DeltaNet convolve q, k, v
(width 4, SiLU) and L2-normalise q and k; Lightning and RetNet do with ``la_short_conv``.

Pure PyTorch: the linear heads run a chunked form over a sequence (``la_chunk_size`` tokens a
chunk, the WY form for the delta rule) and a recurrent step for one token; nothing here needs a
GPU kernel. On a CUDA device with fla installed (``flash-linear-attention``), sequences go
through fla's Triton kernels instead (``chunk_gated_delta_rule``, ``chunk_simple_gla``; fp32 in
and out, the same state layout), unless ``config.la_backend = "torch"``. The state a layer carries between calls (``HwhCache``): the FA heads' keys and
values (sliding-window heads: the last ``window - 1`` of them), the LA heads' fp32 state
[B, n, K, V] and the last ``conv_size - 1`` inputs of their convolutions. Rows may be left-padded (``attention_mask`` zeros first): padding is invisible to
attention and leaves the linear state untouched, and positions count from each row's first
token.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.utils import ModelOutput

from .configuration_hwh import HwhConfig


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight over the last axis, in fp32, cast back."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        x32 = x.float()
        r = torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x32 * r * self.weight.float()).to(x.dtype)


class GatedRMSNorm(RMSNorm):
    """RMSNorm(o) * SiLU(gate) per head over the last axis (the linear heads' output)."""

    def forward(self, o, gate):
        o32 = o.float()
        r = torch.rsqrt(o32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (o32 * r * self.weight.float() * F.silu(gate.float())).to(gate.dtype)


# ---------------------------------------------------------------- positions
def rope_frequencies(head_dim: int, base: float, scaling: dict | None):
    """Angular frequencies w_r = base^(-2r/D) [D/2], with Llama 3.1's "llama3" scaling."""
    w = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    if not scaling or scaling.get("rope_type", scaling.get("type", "default")) == "default":
        return w
    factor, low, high = (float(scaling[k]) for k in ("factor", "low_freq_factor", "high_freq_factor"))
    old = float(scaling["original_max_position_embeddings"])
    wavelen = 2 * math.pi / w
    scaled = torch.where(wavelen > old / low, w / factor, w)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old / high) & (wavelen <= old / low)
    return torch.where(medium, smoothed, scaled)


def apply_rope(x, positions, w, pairing: str = "half"):
    """Rotate x [B, T, H, D] by positions [B, T] at frequencies w [D/2], in fp32."""
    angle = positions.float()[:, :, None, None] * w.to(x.device)
    cos, sin = torch.cos(angle), torch.sin(angle)
    x32 = x.float()
    F_ = x.shape[-1] // 2
    if pairing == "half":
        x1, x2 = x32[..., :F_], x32[..., F_:]
        out = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    else:
        x1, x2 = x32[..., 0::2], x32[..., 1::2]
        out = torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).flatten(-2)
    return out.to(x.dtype)


# ---------------------------------------------------------------- linear-attention forms
def delta_rule_step(q, k, v, g, beta, state):
    """One token of the gated delta rule: q, k [B, H, K], v [B, H, V], g, beta [B, H], state
    [B, H, K, V] fp32 -> (o [B, H, V] fp32, new state)."""
    h = state * g.exp()[..., None, None]
    pred = torch.einsum("bhkv,bhk->bhv", h, k)
    v_new = beta[..., None] * (v - pred)
    h = h + k[..., :, None] * v_new[..., None, :]
    return torch.einsum("bhkv,bhk->bhv", h, q), h


def chunked(q, k, v, g, state, chunk: int, beta=None):
    """A linear state over a sequence in chunks of ``chunk`` tokens: q, k [B, T, H, K] (q
    scaled), v [B, T, H, V], g [B, T, H], state [B, H, K, V] or None; all fp32. ``beta`` None:
    a decaying state, S <- e^g S + k v^T; ``beta`` [B, T, H]: the gated delta rule, its
    in-chunk corrections in the WY form. Returns (o [B, T, H, V], final state). Padding the
    last chunk with g = 0 and zero k, v (beta) leaves the state as the real tokens left it."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    pad = (-T) % chunk
    q, k, v = (F.pad(x, (0, 0, 0, 0, 0, pad)).transpose(1, 2) for x in (q, k, v))
    N, C = (T + pad) // chunk, chunk
    q, k, v = q.reshape(B, H, N, C, K), k.reshape(B, H, N, C, K), v.reshape(B, H, N, C, V)
    g = F.pad(g, (0, 0, 0, pad)).transpose(1, 2).reshape(B, H, N, C).cumsum(-1)
    lower = torch.tril(torch.ones(C, C, dtype=torch.bool, device=q.device))
    decay = torch.where(lower, g[..., :, None] - g[..., None, :], -math.inf).exp()
    u, w = v, None  # the values each chunk writes, and (delta rule) what its state takes back
    if beta is not None:
        beta = F.pad(beta, (0, 0, 0, pad)).transpose(1, 2).reshape(B, H, N, C)
        k_beta = k * beta[..., None]
        a = ((k_beta @ k.transpose(-1, -2)) * decay).masked_fill(~lower.tril(-1), 0.0)
        eye = torch.eye(C, dtype=q.dtype, device=q.device)
        t_inv = torch.linalg.solve_triangular(eye + a, eye.expand_as(a), upper=False)
        u = t_inv @ (v * beta[..., None])
        w = t_inv @ (k_beta * g.exp()[..., None])
    S = torch.zeros(B, H, K, V, dtype=q.dtype, device=q.device) if state is None else state
    out = []
    for n in range(N):
        qn, kn, gn = q[:, :, n], k[:, :, n], g[:, :, n]
        v_new = u[:, :, n] if w is None else u[:, :, n] - w[:, :, n] @ S
        scores = (qn @ kn.transpose(-1, -2)) * decay[:, :, n]
        out.append((qn * gn.exp()[..., None]) @ S + scores @ v_new)
        last = gn[..., -1:]
        S = S * last.exp()[..., None] + (kn * (last - gn).exp()[..., None]).transpose(-1, -2) @ v_new
    o = torch.stack(out, dim=2).reshape(B, H, N * C, V)[:, :, :T]
    return o.transpose(1, 2), S


@functools.cache
def fla_ops():
    """fla's chunked kernels (gated delta rule, gated linear attention with a scalar decay)
    where fla is installed, else None."""
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
        from fla.ops.simple_gla import chunk_simple_gla
    except ImportError:
        return None
    return chunk_gated_delta_rule, chunk_simple_gla


def fla_chunked(q, k, v, g, state, beta=None):
    """``chunked`` through fla's kernels (CUDA tensors; q already scaled, so scale 1)."""
    delta_rule, simple_gla = fla_ops()
    kw = dict(scale=1.0, initial_state=state, output_final_state=True)
    if beta is not None:
        o, S = delta_rule(q, k, v, g, beta, **kw)
    else:
        o, S = simple_gla(q, k, v, g, **kw)
    return o.float(), S.float()


def decay_step(q, k, v, g, state):
    """One token of a decaying state: S <- e^g S + k v^T, o = S^T q (q scaled); g [B, H]."""
    h = state * g.exp()[..., None, None] + k[..., :, None] * v[..., None, :]
    return torch.einsum("bhkv,bhk->bhv", h, q), h


def causal_conv(x, weight, window):
    """Depthwise causal convolution: x [B, T, C], weight [C, 1, W], window [B, W-1, C] (the
    inputs before x) -> (SiLU(conv) [B, T, C], the new window)."""
    xp = torch.cat([window.to(x.dtype), x], dim=1)
    y = F.conv1d(xp.transpose(1, 2), weight.to(x.dtype), groups=x.shape[-1]).transpose(1, 2)
    return F.silu(y), xp[:, xp.shape[1] - window.shape[1] :]


def l2_normalize(x, eps: float = 1e-6):
    """x / sqrt(|x|^2 + eps) over the last axis, in fp32."""
    x32 = x.float()
    return x32 * torch.rsqrt(x32.pow(2).sum(-1, keepdim=True) + eps)


# ---------------------------------------------------------------- heads
class AttentionHeads(nn.Module):
    """``num_heads`` softmax-attention heads (RoPE or NoPE, GQA, optional q/k norm, window)."""

    def __init__(self, config: HwhConfig, num_heads: int, rope: bool, window):
        super().__init__()
        d, D = config.hidden_size, config.head_dim
        self.num_heads, self.head_dim = num_heads, D
        self.num_kv = num_heads // config.q_per_kv
        self.rope, self.window, self.pairing = rope, window, config.rope_pairing
        self.q_proj = nn.Linear(d, num_heads * D, bias=False)
        self.k_proj = nn.Linear(d, self.num_kv * D, bias=False)
        self.v_proj = nn.Linear(d, self.num_kv * D, bias=False)
        self.q_norm = RMSNorm(D, config.rms_norm_eps) if config.qk_norm else None
        self.k_norm = RMSNorm(D, config.rms_norm_eps) if config.qk_norm else None
        # computed at each call, not held as buffers: transformers builds a model on the meta
        # device before it loads the weights, and a buffer made then holds no values
        self.rope_base, self.rope_scaling = config.rope_base, config.rope_freq_scaling

    def forward(self, x, positions, valid, t0: int, cache: dict | None):
        B, T, _ = x.shape
        n, G, D = self.num_heads, self.num_kv, self.head_dim
        q = self.q_proj(x).view(B, T, n, D)
        k = self.k_proj(x).view(B, T, G, D)
        v = self.v_proj(x).view(B, T, G, D)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.rope:
            w = rope_frequencies(D, self.rope_base, self.rope_scaling)
            q, k = apply_rope(q, positions, w, self.pairing), apply_rope(k, positions, w, self.pairing)
        key_valid, k0 = valid, t0  # k0: the time of the first key at hand
        if cache is not None:
            if "k" in cache:
                k = torch.cat([cache["k"], k], dim=1)
                v = torch.cat([cache["v"], v], dim=1)
                key_valid = torch.cat([cache["valid"], valid], dim=1)
                k0 = cache["k0"]
            # a window's heads keep only the keys a later query can see: the last window - 1
            keep = k.shape[1] if self.window is None else min(k.shape[1], self.window - 1)
            cut = k.shape[1] - keep
            cache.update(k=k[:, cut:], v=v[:, cut:], valid=key_valid[:, cut:], k0=k0 + cut)
        S = k.shape[1]
        q_time = t0 + torch.arange(T, device=x.device)
        k_time = k0 + torch.arange(S, device=x.device)
        mask = k_time[None, :] <= q_time[:, None]
        if self.window is not None:
            mask = mask & (k_time[None, :] > q_time[:, None] - self.window)
        mask = mask[None] & key_valid[:, None, :]  # [B, T, S]
        qg = q.float().view(B, T, G, n // G, D)
        logits = torch.einsum("btgrd,bsgd->bgrts", qg, k.float()) / math.sqrt(D)
        m = mask[:, None, None]
        logits = logits.masked_fill(~m, -math.inf)
        p = torch.softmax(logits.masked_fill(~m.any(-1, keepdim=True), 0.0), dim=-1)
        p = p.masked_fill(~m, 0.0)  # a query that sees no key (padding) returns zeros
        o = torch.einsum("bgrts,bsgd->btgrd", p, v.float())
        return o.reshape(B, T, n * D).to(x.dtype)


class LinearHeads(nn.Module):
    """``num_heads`` linear-attention heads of ``config.la_kind`` (module docstring)."""

    def __init__(self, config: HwhConfig, num_heads: int):
        super().__init__()
        d, n = config.hidden_size, num_heads
        K, V = config.la_key_dim, config.la_value_dim
        self.kind, self.num_heads, self.key_dim, self.value_dim = config.la_kind, n, K, V
        self.delta = self.kind in ("gdn", "deltanet")
        self.chunk = config.la_chunk_size
        self.backend = getattr(config, "la_backend", "auto")  # exports before the field: auto
        self.q_proj = nn.Linear(d, n * K, bias=False)
        self.k_proj = nn.Linear(d, n * K, bias=False)
        self.v_proj = nn.Linear(d, n * V, bias=False)
        self.g_proj = nn.Linear(d, n * V, bias=False)
        self.b_proj = nn.Linear(d, n, bias=False) if self.delta else None
        self.a_proj = nn.Linear(d, n, bias=False) if self.kind == "gdn" else None
        self.has_conv = self.delta or config.la_short_conv
        W = config.conv_size
        if self.has_conv:
            self.q_conv = nn.Parameter(torch.zeros(n * K, 1, W))
            self.k_conv = nn.Parameter(torch.zeros(n * K, 1, W))
            self.v_conv = nn.Parameter(torch.zeros(n * V, 1, W))
        if self.kind == "gdn":
            self.A_log = nn.Parameter(torch.zeros(n))
            self.dt_bias = nn.Parameter(torch.zeros(n))
        self.o_norm = GatedRMSNorm(V, config.rms_norm_eps)
        self.rope_base = config.rope_base

    def fixed_decay(self, device):
        """The per-head log decay of Lightning and RetNet [n] (computed at each call, as the
        attention heads' frequencies are)."""
        h = torch.arange(self.num_heads, dtype=torch.float32, device=device)
        if self.kind == "lightning":
            return -(2.0 ** (-8.0 * (h + 1) / self.num_heads))
        return torch.log1p(-(2.0 ** (-5.0 - h)))

    def forward(self, x, positions, valid, cache: dict | None):
        B, T, _ = x.shape
        n, K, V = self.num_heads, self.key_dim, self.value_dim
        keep = valid[..., None].to(x.dtype)
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        if self.has_conv:
            W = self.q_conv.shape[-1]
            qkv = torch.cat([q, k, v], dim=-1) * keep
            window = qkv.new_zeros(B, W - 1, qkv.shape[-1]) if not cache else cache["conv"]
            weight = torch.cat([self.q_conv, self.k_conv, self.v_conv], dim=0)
            qkv, window = causal_conv(qkv, weight, window)
            q, k, v = qkv.split([n * K, n * K, n * V], dim=-1)
        q, k, v = q.reshape(B, T, n, K).float(), k.reshape(B, T, n, K).float(), v.reshape(B, T, n, V).float()
        if self.delta:
            q, k = l2_normalize(q) * K**-0.5, l2_normalize(k)
            beta = torch.sigmoid(self.b_proj(x).float())
            if self.a_proj is not None:
                a = self.a_proj(x).float() + self.dt_bias.float()
                g = -self.A_log.float().exp() * F.softplus(a)
            else:
                g = torch.zeros_like(beta)
            beta, g = beta * valid[..., None], g * valid[..., None]
        else:
            if self.kind == "lightning" and not self.has_conv:
                q, k = F.silu(q), F.silu(k)
            if self.kind == "retnet":
                w = rope_frequencies(K, self.rope_base, None)
                q, k = apply_rope(q, positions, w), apply_rope(k, positions, w)
            q = q * K**-0.5
            k, v = k * valid[..., None, None], v * valid[..., None, None]
            g = self.fixed_decay(x.device).expand(B, T, n) * valid[..., None]
        state = None if not cache else cache["state"]
        if T == 1 and state is not None:
            if self.delta:
                o, state = delta_rule_step(q[:, 0], k[:, 0], v[:, 0], g[:, 0], beta[:, 0], state)
            else:
                o, state = decay_step(q[:, 0], k[:, 0], v[:, 0], g[:, 0], state)
            o = o[:, None]
        else:
            b = beta if self.delta else None
            if self.backend == "auto" and q.is_cuda and fla_ops() is not None:
                o, state = fla_chunked(q, k, v, g, state, b)  # fla picks its own chunk
            else:
                o, state = chunked(q, k, v, g, state, self.chunk, b)
        if cache is not None:
            cache["state"] = state
            if self.has_conv:
                cache["conv"] = window
        gate = self.g_proj(x).view(B, T, n, V)
        return self.o_norm(o, gate).reshape(B, T, n * V)


class Mixer(nn.Module):
    """One layer's heads side by side and their output projection."""

    def __init__(self, config: HwhConfig, spec: dict):
        super().__init__()
        num_fa, num_la = int(spec["num_fa"]), int(spec["num_la"])
        self.fa = AttentionHeads(config, num_fa, bool(spec.get("fa_rope")), spec.get("window")) if num_fa else None
        self.la = LinearHeads(config, num_la) if num_la else None
        width = num_fa * config.head_dim + num_la * config.la_value_dim
        self.o_proj = nn.Linear(width, config.hidden_size, bias=False)

    def forward(self, x, positions, valid, t0, cache):
        outs = []
        if self.fa is not None:
            outs.append(self.fa(x, positions, valid, t0, None if cache is None else cache["fa"]))
        if self.la is not None:
            outs.append(self.la(x, positions, valid, None if cache is None else cache["la"]))
        return self.o_proj(torch.cat(outs, dim=-1) if len(outs) > 1 else outs[0])


class MLP(nn.Module):
    """SwiGLU: down(SiLU(x W_gate) * x W_up)."""

    def __init__(self, d: int, hidden: int):
        super().__init__()
        self.gate = nn.Linear(d, hidden, bias=False)
        self.up = nn.Linear(d, hidden, bias=False)
        self.down = nn.Linear(hidden, d, bias=False)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


class Block(nn.Module):
    """Pre-norm residual layer: x + Mixer(RMSNorm(x)), then + MLP(RMSNorm(.))."""

    def __init__(self, config: HwhConfig, spec: dict):
        super().__init__()
        self.mixer_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mixer = Mixer(config, spec)
        self.mlp_norm = self.mlp = None
        if config.intermediate_size:
            self.mlp_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
            self.mlp = MLP(config.hidden_size, config.intermediate_size)

    def forward(self, x, positions, valid, t0, cache):
        x = x + self.mixer(self.mixer_norm(x), positions, valid, t0, cache)
        if self.mlp is not None:
            x = x + self.mlp(self.mlp_norm(x))
        return x


# ---------------------------------------------------------------- the model
class HwhCache:
    """What ``generate`` carries between steps: the time of the next token, each row's number
    of left-padding slots, and per layer {"fa": keys, values, their validity; "la": the fp32
    state and the convolution's window}."""

    def __init__(self, num_layers: int):
        self.t = 0
        self.start = None
        self.layers = [{"fa": {}, "la": {}} for _ in range(num_layers)]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.t

    def reorder_cache(self, beam_idx):
        """Select rows (beam search)."""
        self.start = self.start.index_select(0, beam_idx)
        for layer in self.layers:
            for part in layer.values():
                for key, x in part.items():
                    if torch.is_tensor(x):  # not k0, the time of the first key kept
                        part[key] = x.index_select(0, beam_idx.to(x.device))


@dataclass
class HwhOutput(ModelOutput):
    """logits [B, T, vocab] (fp32), the loss when labels were given, and the cache (``cache``
    and ``past_key_values`` name the same object, for transformers' older and newer
    ``generate``)."""

    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    cache: HwhCache | None = None
    past_key_values: HwhCache | None = None


class HwhPreTrainedModel(PreTrainedModel):
    """Weights are loaded from an hwh-jax export; a fresh model is initialised small."""

    config_class = HwhConfig
    base_model_prefix = "model"
    _no_split_modules = ["Block"]

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=0.02)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=0.02)


class HwhModel(HwhPreTrainedModel):
    """Embedding, blocks, final norm: tokens -> hidden states."""

    def __init__(self, config: HwhConfig):
        super().__init__(config)
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        self.positions = (
            nn.Parameter(torch.zeros(config.abs_positions, config.hidden_size)) if config.abs_positions else None
        )
        self.blocks = nn.ModuleList([Block(config, spec) for spec in config.layers])
        self.final_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_init()

    def get_input_embeddings(self):
        return self.embed

    def set_input_embeddings(self, value):
        self.embed = value

    def forward(self, input_ids, attention_mask=None, cache: HwhCache | None = None):
        B, T = input_ids.shape
        t0 = 0 if cache is None else cache.t
        if cache is not None and cache.start is None:
            cache.start = _left_padding(attention_mask, B, T, input_ids.device)
        start = (
            cache.start if cache is not None else _left_padding(attention_mask, B, T, input_ids.device)
        )
        times = t0 + torch.arange(T, device=input_ids.device)
        valid = times[None] >= start[:, None]
        positions = (times[None] - start[:, None]).clamp(min=0)
        x = self.embed(input_ids)
        if self.positions is not None:
            if t0 + T > self.positions.shape[0]:
                raise ValueError(f"{t0 + T} positions do not fit abs_positions={self.positions.shape[0]}")
            x = x + self.positions[positions].to(x.dtype)
        for l, block in enumerate(self.blocks):
            x = block(x, positions, valid, t0, None if cache is None else cache.layers[l])
        if cache is not None:
            cache.t = t0 + T
        return self.final_norm(x)


def _left_padding(attention_mask, B: int, T: int, device):
    """Left-padding slots of each row [B] from a 0/1 mask of zeros then ones (None: none)."""
    if attention_mask is None:
        return torch.zeros(B, dtype=torch.long, device=device)
    mask = attention_mask.to(torch.long)
    pads = T - mask.sum(-1)
    ok = (mask == (torch.arange(T, device=device)[None] >= pads[:, None]).long()).all()
    if not ok:
        raise ValueError("attention_mask must be left padding: zeros, then ones, in every row")
    return pads


class HwhForCausalLM(HwhPreTrainedModel, GenerationMixin):
    """The language model: ``HwhModel`` and the head (tied to the embedding by default)."""

    _tied_weights_keys = {"lm_head.weight": "model.embed.weight"}

    def __init__(self, config: HwhConfig):
        super().__init__(config)
        self.model = HwhModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self):
        return self.model.embed

    def get_output_embeddings(self):
        return self.lm_head

    def set_output_embeddings(self, value):
        self.lm_head = value

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # the cache is HwhCache: keys and values beside linear states

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        cache: HwhCache | None = None,
        past_key_values: HwhCache | None = None,
        labels=None,
        use_cache: bool | None = None,
        **kwargs,
    ):
        cache = cache if cache is not None else past_key_values
        if cache is None and use_cache:
            cache = HwhCache(self.config.num_hidden_layers)
        h = self.model(input_ids, attention_mask, cache)
        logits = self.lm_head(h).float()
        loss = None
        if labels is not None:
            loss = F.cross_entropy(
                logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100
            )
        return HwhOutput(loss=loss, logits=logits, cache=cache, past_key_values=cache)

    def prepare_inputs_for_generation(self, input_ids, attention_mask=None, use_cache=True, **kwargs):
        """The whole prompt first, then the newest token over the cache; ``use_cache=False``:
        the whole sequence at every step."""
        cache = kwargs.get("cache") or kwargs.get("past_key_values")
        if cache is not None and cache.t > 0:
            input_ids = input_ids[:, cache.t :]
        use_cache = use_cache is not False
        return {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "cache": cache if use_cache else None,
            "use_cache": use_cache,
        }

    def _reorder_cache(self, cache, beam_idx):
        cache.reorder_cache(beam_idx)
        return cache
