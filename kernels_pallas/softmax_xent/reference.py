"""Softmax cross entropy of logit rows with the logits' gradient, in jnp (the specification).

For logits l [..., V], integer targets t [...] and weights a, b [...] (fp32):

    logZ = log sum_v exp(l_v)          nll = logZ - l_t
    d    = softmax(l) * (a + b logZ) - a * onehot(t)

d is the gradient of sum (a nll + b logZ^2 / 2) with respect to l: a mean masked loss has
a = mask / count, PaLM's z-loss z * mean(logZ^2) adds b = 2 z mask / count. The math is fp32
whatever the logits' dtype; d is returned in the logits' dtype. ``xent_stats`` and
``xent_grad`` are the two halves, which ``hwh_jax.layers.loss.token_nll`` (the unfused loss) takes
as its forward and backward.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

f32 = jnp.float32


def xent_stats(logits, targets):
    """(nll, logZ) [...] fp32 of logits [..., V] and int targets [...]."""
    l32 = logits.astype(f32)
    logz = jax.nn.logsumexp(l32, axis=-1)
    gold = jnp.take_along_axis(l32, targets[..., None], axis=-1)[..., 0]
    return logz - gold, logz


def xent_grad(logits, targets, logz, a, c):
    """softmax(logits) * c - a * onehot(targets) [..., V] in the logits' dtype (fp32 inside),
    given logZ; a, c [...]."""
    p = jnp.exp(logits.astype(f32) - logz[..., None])
    hit = jnp.arange(logits.shape[-1]) == targets[..., None]
    d = p * c[..., None] - jnp.where(hit, a[..., None], 0.0)
    return d.astype(logits.dtype)


def softmax_xent_reference(logits, targets, a, b):
    """logits [N, V], targets [N] int, a, b [N] -> (nll [N] fp32, logZ [N] fp32, d [N, V])."""
    nll, logz = xent_stats(logits, targets)
    return nll, logz, xent_grad(logits, targets, logz, a, a + b * logz)
