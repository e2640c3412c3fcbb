"""Per-layer q and k of a model's FA heads, captured without changing its numerics.

The forward is the model's own, block by block; before each block the FA heads' projections
are read off the same normalised input the block uses (``FullAttentionHeads.qk``: after q/k
norm, before rotation). The final logits come out of the same pass, so a test can check that
they equal ``model(tokens)``.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class LayerQK:
    """One FA layer's queries and keys as the attention sees them before rotation, with what
    the RoPE decomposition needs (frequencies, pairing, scale, GQA grouping)."""

    layer: int = dataclasses.field(metadata=dict(static=True))
    q: jnp.ndarray  # [B, T, H, D] after q-norm, before rotation
    k: jnp.ndarray  # [B, T, G, D]
    frequencies: jnp.ndarray  # [D/2] RoPE angular frequencies (NoPE heads: what RoPE would
    #                           use; ``analysis.run`` analyses those heads with angle 0)
    rope: bool = dataclasses.field(metadata=dict(static=True))
    q_per_kv: int = dataclasses.field(metadata=dict(static=True))
    scale: float = dataclasses.field(metadata=dict(static=True))
    pairing: str = dataclasses.field(metadata=dict(static=True))


def capture_qk(model, tokens, positions=None):
    """(list of LayerQK for layers with FA heads, logits [B, T, vocab])."""
    if positions is None:
        positions = jnp.arange(tokens.shape[1])[None]
    x = model.embed_tokens(tokens)
    out = []
    for l, block in enumerate(model.blocks):
        fa = block.mixer.fa
        if fa is not None:
            q, k = fa.qk(block.mixer_norm(x), positions)
            out.append(
                LayerQK(
                    l,
                    q,
                    k,
                    fa.frequencies(),
                    fa.rope,
                    fa.num_heads // fa.num_kv,
                    fa.head_dim**-0.5,
                    fa.rope_pairing,
                )
            )
        x = block(x, positions)
    return out, model.logits(model.final_norm(x))
