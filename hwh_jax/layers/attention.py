"""Full-attention heads: RoPE or NoPE, GQA, optional q/k RMSNorm, optional sliding window.

    q = x W_q, k = x W_k, v = x W_v  (n kv heads = n query heads / q_per_kv)
    [q, k <- RMSNorm(q), RMSNorm(k) per head]   (Qwen3)
    [q, k <- RoPE(q, t), RoPE(k, t)]            (NoPE: no position signal at all)
    o = softmax(q k^T / sqrt(D) + mask) v        (kernels_pallas.attention)
The module returns the heads' outputs [B, T, n*D]; the mixer owns the output projection.
"""
from __future__ import annotations

from flax import nnx

import kernels_pallas
from hwh_jax.layers.linear import dense
from hwh_jax.layers.nnx_compat import data
from hwh_jax.layers.norms import RMSNorm
from hwh_jax.layers.rope import apply_rope


class FullAttentionHeads(nnx.Module):
    def __init__(self, d_model: int, num_heads: int, head_dim: int, *, q_per_kv: int = 1,
                 rope: bool, rope_theta: float = 10000.0, rope_pairing: str = "half",
                 window: int | None = None, qk_norm: bool = False, norm_eps: float = 1e-6,
                 impl: str = "auto", dtype, param_dtype, rngs: nnx.Rngs):
        self.num_heads, self.head_dim = num_heads, head_dim
        self.num_kv = num_heads // q_per_kv
        self.rope, self.rope_theta, self.rope_pairing = rope, rope_theta, rope_pairing
        self.window, self.impl, self.dtype = window, impl, dtype
        kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.q_proj = dense(d_model, num_heads * head_dim, ("embed", "heads"), **kw)
        self.k_proj = dense(d_model, self.num_kv * head_dim, ("embed", "kv_heads"), **kw)
        self.v_proj = dense(d_model, self.num_kv * head_dim, ("embed", "kv_heads"), **kw)
        norm_kw = dict(eps=norm_eps, dtype=dtype, param_dtype=param_dtype)
        self.q_norm = data(RMSNorm(head_dim, **norm_kw) if qk_norm else None)
        self.k_norm = data(RMSNorm(head_dim, **norm_kw) if qk_norm else None)

    def qk(self, x, positions):
        """Projected (normed, rotated) q [B,T,H,D] and k [B,T,G,D]: what the analysis captures."""
        B, T, _ = x.shape
        q = self.q_proj(x).reshape(B, T, self.num_heads, self.head_dim)
        k = self.k_proj(x).reshape(B, T, self.num_kv, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        return q, k

    def __call__(self, x, positions, segment_ids=None):
        B, T, _ = x.shape
        q, k = self.qk(x, positions)
        v = self.v_proj(x).reshape(B, T, self.num_kv, self.head_dim)
        if self.rope:
            kw = dict(theta=self.rope_theta, pairing=self.rope_pairing)
            q, k = apply_rope(q, positions, **kw), apply_rope(k, positions, **kw)
        o = kernels_pallas.attention(q, k, v, causal=True, window=self.window,
                                     segment_ids=segment_ids, impl=self.impl)
        return o.reshape(B, T, self.num_heads * self.head_dim)
