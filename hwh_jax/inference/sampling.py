"""Next-token choice from fp32 logits: greedy, or temperature with nucleus (top-p) filtering."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def sample(logits, key, *, temperature: float = 0.0, top_p: float = 1.0, vocab: int | None = None):
    """logits [B, V] -> token ids [B] int32.

    temperature 0 is greedy (argmax). Otherwise tokens are drawn from softmax(logits / T)
    restricted to the smallest set of most likely tokens whose mass reaches ``top_p``.
    ``vocab`` masks padded vocabulary rows beyond the tokenizer's size.
    """
    if temperature < 0 or not 0 < top_p <= 1:
        raise ValueError(f"need temperature >= 0 and 0 < top_p <= 1, got {temperature}, {top_p}")
    if vocab is not None and vocab < logits.shape[-1]:
        logits = jnp.where(jnp.arange(logits.shape[-1]) < vocab, logits, -jnp.inf)
    if temperature == 0:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    logits = logits / temperature
    if top_p < 1:
        order = jnp.argsort(-logits, axis=-1)
        sorted_logits = jnp.take_along_axis(logits, order, axis=-1)
        probs = jax.nn.softmax(sorted_logits, axis=-1)
        before = jnp.cumsum(probs, axis=-1) - probs  # mass of strictly more likely tokens
        sorted_logits = jnp.where(before < top_p, sorted_logits, -jnp.inf)
        logits = (
            jnp.full_like(logits, -jnp.inf)
            .at[jnp.arange(logits.shape[0])[:, None], order]
            .set(sorted_logits)
        )
    return jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)
