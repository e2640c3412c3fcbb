"""Softmax cross entropy of logit rows with the logits' gradient, in jnp (the specification).

For rows of logits l [N, V], integer targets t [N] and per-row weights a, b [N] (fp32):

    logZ = log sum_v exp(l_v)          nll = logZ - l_t
    d    = softmax(l) * (a + b logZ) - a * onehot(t)

d is the gradient of sum_i (a_i nll_i + b_i logZ_i^2 / 2) with respect to l: a mean masked
loss has a = mask / count, PaLM's z-loss z * mean(logZ^2) adds b = 2 z mask / count. The math is
fp32 whatever the logits' dtype; d is returned in the logits' dtype.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

f32 = jnp.float32


def softmax_xent_reference(logits, targets, a, b):
    """logits [N, V], targets [N] int, a, b [N] -> (nll [N] fp32, logZ [N] fp32, d [N, V])."""
    l32 = logits.astype(f32)
    logz = jax.nn.logsumexp(l32, axis=-1)
    gold = jnp.take_along_axis(l32, targets[:, None], axis=-1)[:, 0]
    p = jnp.exp(l32 - logz[:, None])
    hit = jnp.arange(logits.shape[-1]) == targets[:, None]
    c = (a + b * logz)[:, None]
    d = p * c - jnp.where(hit, a[:, None], 0.0)
    return logz - gold, logz, d.astype(logits.dtype)
