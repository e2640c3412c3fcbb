"""Full-attention heads: RoPE or NoPE, GQA, optional q/k RMSNorm, optional sliding window.

    q = x W_q, k = x W_k, v = x W_v  (n kv heads = n query heads / q_per_kv)
    [q, k <- RMSNorm(q), RMSNorm(k) per head]   (Qwen3)
    [q, k <- RoPE(q, t), RoPE(k, t)]            (NoPE: no position signal at all)
    o = softmax(q k^T / sqrt(D) + mask) v        (kernels_pallas.attention)
The module returns the heads' outputs [B, T, n*D]; the mixer owns the output projection.

Inference (``init_cache`` / ``extend``): keys (rotated) and values of past tokens live in a
cache whose slots are indexed by absolute time t (rows are left-padded to a common t; row b's
tokens start at ``start[b]``). Global heads keep every slot; sliding-window heads keep a ring of
``window`` slots (slot = t mod window), each slot tagged with the time it holds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
from flax import nnx

import kernels_pallas
from hwh_jax.layers.linear import dense
from hwh_jax.layers.norms import RMSNorm
from hwh_jax.layers.rope import apply_rope, scaled_frequencies
from hwh_jax.layers.variables import data

if TYPE_CHECKING:
    from hwh_jax.layers.config import LayerSpec, ModelConfig


class FullAttentionHeads(nnx.Module):
    """``num_heads`` softmax-attention heads of dim D over the normalised input x [B, T, d]
    (module docstring):

    1. Project: q [B, T, n*D], k, v [B, T, (n / q_per_kv)*D] (``projections()``).
    2. Split heads; RMSNorm q and k per head if ``qk_norm``; RoPE on both if ``rope`` (NoPE
       heads get no position signal at all).
    3. Causal attention (a sliding ``window`` if set; within documents given segment ids)
       through ``kernels_pallas.attention`` -> [B, T, n*D].
    """

    def __init__(self, cfg: ModelConfig, spec: LayerSpec, *, rngs: nnx.Rngs):
        """``spec.num_fa`` heads of dim ``cfg.head_dim``, RoPE as ``spec.fa_rope`` says, over
        ``spec.window`` (None: global); the rest from ``cfg``."""
        num_heads, head_dim, d_model = spec.num_fa, cfg.head_dim, cfg.d_model
        dtype, param_dtype = cfg.compute_dtype, cfg.weight_dtype
        self.num_heads, self.head_dim = num_heads, head_dim
        self.num_kv = num_heads // cfg.q_per_kv
        self.rope, self.rope_theta, self.rope_pairing = (
            spec.fa_rope,
            cfg.rope_theta,
            cfg.rope_pairing,
        )
        self.rope_scaling = tuple(cfg.rope_scaling)
        self.window, self.dtype = spec.window, dtype
        self.settings = cfg.attention_settings()
        self.decode_settings = cfg.decode_attention_settings()
        kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.q_proj = dense(d_model, num_heads * head_dim, ("embed", "heads"), **kw)
        self.k_proj = dense(d_model, self.num_kv * head_dim, ("embed", "kv_heads"), **kw)
        self.v_proj = dense(d_model, self.num_kv * head_dim, ("embed", "kv_heads"), **kw)
        norm_kw = dict(
            eps=cfg.norm_eps, dtype=dtype, param_dtype=param_dtype, settings=cfg.norm_settings()
        )
        self.q_norm = data(RMSNorm(head_dim, **norm_kw) if cfg.qk_norm else None)
        self.k_norm = data(RMSNorm(head_dim, **norm_kw) if cfg.qk_norm else None)

    def qk(self, x, positions):
        """Projected (normed, rotated) q [B,T,H,D] and k [B,T,G,D]: what the analysis captures."""
        return self._qk_heads(self.q_proj(x), self.k_proj(x))

    def _qk_heads(self, q, k):
        """Projections [B, T, n*D] -> q [B,T,H,D], k [B,T,G,D], normed if qk_norm."""
        B, T, _ = q.shape
        q = q.reshape(B, T, self.num_heads, self.head_dim)
        k = k.reshape(B, T, self.num_kv, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        return q, k

    def frequencies(self):
        """RoPE angular frequencies w_r [D/2] (with the configured scaling)."""
        return scaled_frequencies(self.head_dim, self.rope_theta, self.rope_scaling)

    def projections(self):
        """The input projections, in the order ``attend`` takes their outputs."""
        return (self.q_proj, self.k_proj, self.v_proj)

    def __call__(self, x, positions, segment_ids=None):
        return self.attend(*(p(x) for p in self.projections()), positions, segment_ids)

    def attend(self, q, k, v, positions, segment_ids=None):
        """The heads' outputs [B, T, n*D] from their projections q, k, v [B, T, n*D]."""
        B, T, _ = q.shape
        q, k = self._qk_heads(q, k)
        v = v.reshape(B, T, self.num_kv, self.head_dim)
        if self.rope:
            kw = dict(pairing=self.rope_pairing, frequencies=self.frequencies())
            q, k = apply_rope(q, positions, **kw), apply_rope(k, positions, **kw)
        o = kernels_pallas.attention(
            q,
            k,
            v,
            causal=True,
            window=self.window,
            segment_ids=segment_ids,
            settings=self.settings,
        )
        return o.reshape(B, T, self.num_heads * self.head_dim)

    # ------------------------------------------------------------ inference
    def init_cache(self, batch: int, max_len: int, dtype):
        size = max_len if self.window is None else min(self.window, max_len)
        shape = (batch, size, self.num_kv, self.head_dim)
        cache = {"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype)}
        if self.window is not None:
            cache["time"] = jnp.full((size,), -1, jnp.int32)
        return cache

    def extend(self, proj, t0, start, cache, fresh: bool = False):
        """proj: the projections q, k, v [B, Tn, n*D] of the input at times t0 .. t0+Tn-1 (t0
        traced is fine); start [B] int32. Returns (heads' outputs [B, Tn, n*D], updated cache).
        ``fresh``: the cache holds nothing yet (t0 = 0, a prompt's first chunk): the chunk
        attends over its own keys only, through the training attention (``_fresh_attention``)."""
        B, Tn, _ = proj[0].shape
        times = t0 + jnp.arange(Tn, dtype=jnp.int32)
        positions = jnp.maximum(times[None] - start[:, None], 0)
        q, k = self._qk_heads(proj[0], proj[1])
        v = proj[2].reshape(B, Tn, self.num_kv, self.head_dim)
        if self.rope:
            kw = dict(pairing=self.rope_pairing, frequencies=self.frequencies())
            q, k = apply_rope(q, positions, **kw), apply_rope(k, positions, **kw)
        k, v = k.astype(cache["k"].dtype), v.astype(cache["v"].dtype)
        if self.window is None:  # write, then attend over every slot written so far
            ck = jax.lax.dynamic_update_slice(cache["k"], k, (0, t0, 0, 0))
            cv = jax.lax.dynamic_update_slice(cache["v"], v, (0, t0, 0, 0))
            slots = jnp.arange(ck.shape[1], dtype=jnp.int32)
            k_time = jnp.where(slots < t0 + Tn, slots, -1)
            new = {"k": ck, "v": cv}
            keys, vals = ck, cv
        else:  # the ring may be smaller than Tn: attend over ring + new, then write the tail
            size = cache["k"].shape[1]
            keys = jnp.concatenate([cache["k"], k], axis=1)
            vals = jnp.concatenate([cache["v"], v], axis=1)
            k_time = jnp.concatenate([cache["time"], times])
            m = min(Tn, size)
            slot = times[-m:] % size
            new = {
                "k": cache["k"].at[:, slot].set(k[:, -m:]),
                "v": cache["v"].at[:, slot].set(v[:, -m:]),
                "time": cache["time"].at[slot].set(times[-m:]),
            }
        if fresh:
            o = self._fresh_attention(q, k, v, start)
        else:  # prefill chunks: blockwise over the cache (O(Tn x block) memory, the cache's
            # dtype in the products); a decode step (Tn = 1): decode_attention (its settings)
            kw = dict(q_time=times, k_time=k_time, k_start=start, window=self.window)
            if Tn > 1:
                o = kernels_pallas.cached_attention_blockwise(q, keys, vals, **kw)
            else:
                o = kernels_pallas.decode_attention(
                    q, keys, vals, settings=self.decode_settings, **kw
                )
        return o.reshape(B, Tn, self.num_heads * self.head_dim), new

    def _fresh_attention(self, q, k, v, start):
        """A first chunk's attention over itself, as in training (causal, the window; cuDNN's
        flash attention on a GPU), for left-padded rows: row b's tokens from ``start[b]`` on are
        rolled to the front, where the causal mask alone keeps its queries off the padding
        (rolled behind them), and rolled back; padding queries return zeros, as they do over
        the cache (they see no key)."""
        B, Tn = q.shape[:2]
        t = jnp.arange(Tn, dtype=jnp.int32)[None]
        roll = lambda x, i: jnp.take_along_axis(x, i[:, :, None, None], axis=1)
        front = jnp.minimum(t + start[:, None], Tn - 1)
        o = kernels_pallas.attention(
            roll(q.astype(k.dtype), front),
            roll(k, front),
            roll(v, front),
            causal=True,
            window=self.window,
            settings=self.settings,
        )
        o = roll(o, jnp.maximum(t - start[:, None], 0))
        return jnp.where((t >= start[:, None])[..., None, None], o, 0).astype(q.dtype)
