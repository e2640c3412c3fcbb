"""Gated linear attention in chunks of C tokens, in jnp: the recurrence of ``reference.py``
computed chunk by chunk, a matmul within a chunk and a state carried across chunks.

Within a chunk, with b_t = g_1 + ... + g_t (cumulative log decay per key, from the chunk's
start) and h the state entering it:

    o_t    = scale * [ (q_t * exp(b_t))^T h  +  sum_{s <= t} (q_t * exp(b_t - b_s)) . k_s v_s ]
    h_out  = diag(exp(b_C)) h  +  sum_s (k_s * exp(b_C - b_s)) v_s^T

Every exponent is <= 0 (g <= 0 and s <= t), so nothing overflows, however strong the decay:
the intra-chunk weights are formed as a [C, C, K] tensor of exp(b_t - b_s) for a decay per key
(exact and simple; the kernels factor it), and as a [C, C] matrix for a decay per head (one
value for all K: Lightning, RetNet, Mamba-2), where q_t . k_s is then weighted as a whole.
fp32 throughout; T is padded to a multiple of C with zero keys and values (they write nothing)
and the padding cut from the output.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

_HI = jax.lax.Precision.HIGHEST


def decay_attention_chunked(
    q, k, v, g, *, scale=None, chunk_size: int = 64, initial_state=None, output_final_state=False
):
    """Same arguments and result as ``decay_attention_recurrent``."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    C = chunk_size
    scale = K**-0.5 if scale is None else scale
    f32 = jnp.float32
    scalar = g.ndim == 3  # [B, T, H]: per head
    g = (g[..., None] if scalar else g).astype(f32)  # [B, T, H, 1 or K]
    pad = -T % C
    if pad:
        q, k, v, g = (jnp.pad(a, [(0, 0), (0, pad), (0, 0), (0, 0)]) for a in (q, k, v, g))
    n = (T + pad) // C

    def chunks(a):  # [B, n*C, H, X] -> [n, B, H, C, X]
        return a.astype(f32).reshape(B, n, C, H, a.shape[-1]).transpose(1, 0, 3, 2, 4)

    qc, kc, vc, gc = chunks(q) * scale, chunks(k), chunks(v), chunks(g)
    b = jnp.cumsum(gc, axis=-2)  # [n, B, H, C, 1 or K]
    causal = jnp.tril(jnp.ones((C, C), bool))
    h0 = jnp.zeros((B, H, K, V), f32) if initial_state is None else initial_state.astype(f32)

    def body(h, xs):
        q_, k_, v_, b_ = xs  # [B, H, C, X]
        diff = b_[..., :, None, :] - b_[..., None, :, :]  # [B, H, C(t), C(s), 1 or K]
        w = jnp.where(causal[..., None], jnp.exp(jnp.minimum(diff, 0.0)), 0.0)
        if scalar:
            a = jnp.einsum("bhtk,bhsk->bhts", q_, k_, precision=_HI) * w[..., 0]
        else:
            a = jnp.einsum("bhtk,bhsk,bhtsk->bhts", q_, k_, w, precision=_HI)
        o = jnp.einsum("bhts,bhsv->bhtv", a, v_, precision=_HI)
        o = o + jnp.einsum("bhtk,bhkv->bhtv", q_ * jnp.exp(b_), h, precision=_HI)
        last = b_[..., -1:, :]  # [B, H, 1, K]
        h = h * jnp.exp(last[..., 0, :])[..., None] + jnp.einsum(
            "bhsk,bhsv->bhkv", k_ * jnp.exp(last - b_), v_, precision=_HI
        )
        return h, o

    h_final, o = jax.lax.scan(body, h0, (qc, kc, vc, b))
    o = o.transpose(1, 0, 3, 2, 4).reshape(B, n * C, H, V)[:, :T]
    return o.astype(v.dtype), (h_final if output_final_state else None)
