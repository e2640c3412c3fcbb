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


def scaled_frequencies(head_dim: int, theta: float, scaling=()):
    """w_r with an HF ``rope_scaling`` applied; ``scaling`` is a dict or (key, value) pairs.

    "llama3" (Llama 3.1): periods longer than original_max_position_embeddings / low_freq_factor
    are stretched by ``factor``, shorter than ... / high_freq_factor kept, smooth in between."""
    w = rope_frequencies(head_dim, theta)
    s = dict(scaling)
    kind = s.get("rope_type", s.get("type", "default"))
    if kind == "default" or not s:
        return w
    if kind != "llama3":
        raise ValueError(f"rope scaling {kind!r} is not supported (only 'llama3' and 'default')")
    factor, low, high = (
        float(s["factor"]),
        float(s["low_freq_factor"]),
        float(s["high_freq_factor"]),
    )
    old = float(s["original_max_position_embeddings"])
    wavelen = 2 * jnp.pi / w
    scaled = jnp.where(wavelen > old / low, w / factor, w)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old / high) & (wavelen <= old / low)
    return jnp.where(medium, smoothed, scaled)


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


def apply_rope(x, positions, *, theta: float = 10000.0, pairing: str = "half", frequencies=None):
    """Rotate x [B, T, H, D] by positions [B, T] (or [T]); math in fp32, result in x's dtype.

    ``frequencies`` overrides theta (e.g. Llama 3.1's rescaled frequencies)."""
    w = rope_frequencies(x.shape[-1], theta) if frequencies is None else frequencies
    positions = jnp.asarray(positions, jnp.float32)
    if positions.ndim == 1:
        positions = positions[None]
    angle = positions[:, :, None, None] * w  # [B, T, 1, F]
    cos, sin = jnp.cos(angle), jnp.sin(angle)
    x1, x2 = split_pairs(x.astype(jnp.float32), pairing)
    out = merge_pairs(x1 * cos - x2 * sin, x2 * cos + x1 * sin, pairing)
    return out.astype(x.dtype)
