"""Rotary position embedding (Su et al., 2021), both pairings found in the wild.

Head dim D holds F = D/2 two-dimensional groups; group r rotates by angle t * w_r with
w_r = theta^(-2r/D) (r = 0 is the highest frequency). Pairings:
  "half"         group r = dims (r, r + F)   (HF Llama / Qwen "rotate_half")
  "interleaved"  group r = dims (2r, 2r + 1) (original RoFormer, GPT-J)
Either way q~_t . k~_s = sum_r q_t^(r)^T R((s - t) w_r) k_s^(r): logits depend on s - t only.
"""
from __future__ import annotations

import jax.numpy as jnp

PAIRINGS = ("half", "interleaved")


def rope_frequencies(head_dim: int, theta: float):
    """w_r for r = 0..F-1, fp32 [F]."""
    return theta ** (-jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim)


def split_pairs(x, pairing: str):
    """x [..., D] -> (x1, x2) [..., F] with group r = (x1[r], x2[r])."""
    F = x.shape[-1] // 2
    if pairing == "half":
        return x[..., :F], x[..., F:]
    if pairing == "interleaved":
        return x[..., 0::2], x[..., 1::2]
    raise ValueError(f"rope pairing must be one of {PAIRINGS}, got {pairing!r}")


def merge_pairs(x1, x2, pairing: str):
    if pairing == "half":
        return jnp.concatenate([x1, x2], axis=-1)
    return jnp.stack([x1, x2], axis=-1).reshape(*x1.shape[:-1], 2 * x1.shape[-1])


def apply_rope(x, positions, *, theta: float = 10000.0, pairing: str = "half",
               frequencies=None):
    """Rotate x [B, T, H, D] by positions [B, T] (or [T]); math in fp32, result in x's dtype.

    ``frequencies`` overrides theta (e.g. Llama 3.1's rescaled frequencies)."""
    w = rope_frequencies(x.shape[-1], theta) if frequencies is None else frequencies
    positions = jnp.asarray(positions, jnp.float32)
    if positions.ndim == 1:
        positions = positions[None]
    angle = positions[:, :, None, None] * w                      # [B, T, 1, F]
    cos, sin = jnp.cos(angle), jnp.sin(angle)
    x1, x2 = split_pairs(x.astype(jnp.float32), pairing)
    out = merge_pairs(x1 * cos - x2 * sin, x2 * cos + x1 * sin, pairing)
    return out.astype(x.dtype)
