"""The copy task: can an architecture learn to copy a random string it has seen (the simplest
retrieval, by an induction circuit)? ``bench/copy_task.py`` runs it per architecture.

Each sequence is a random string of ``length`` tokens (ids 2..vocab-1), a separator (id 1), then
the same string again; the loss is on the copy only (chance: ln(vocab - 2), 4.13 nats at 64).
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from hwh_jax.layers.loss import cross_entropy
from hwh_jax.models import HybridLM, model_config


def copy_batch(rng, batch, length, vocab):
    s = rng.integers(2, vocab, (batch, length))
    x = np.concatenate([s, np.ones((batch, 1), s.dtype), s], 1)
    mask = np.zeros((batch, 2 * length), np.float32)
    mask[:, length:] = 1.0  # predicting the copy's tokens
    return jnp.asarray(x[:, :-1]), jnp.asarray(x[:, 1:]), jnp.asarray(mask)


def train_copy(arch, size, *, steps, length=24, vocab=64, batch=32, lr=3e-3, seed=0, log_every=100):
    """Copy loss every ``log_every`` steps: [(step, loss, seconds)]."""
    cfg = model_config(arch, size, vocab_size=vocab, dtype="float32")
    graphdef, params = nnx.split(HybridLM(cfg, rngs=nnx.Rngs(seed)), nnx.Param)
    tx = optax.adam(lr)
    opt = tx.init(params)
    rng = np.random.default_rng(seed)

    @jax.jit
    def step(params, opt, x, y, m):
        loss, grads = jax.value_and_grad(
            lambda p: cross_entropy(nnx.merge(graphdef, p)(x), y, m)[0]
        )(params)
        updates, opt = tx.update(grads, opt, params)
        return optax.apply_updates(params, updates), opt, loss

    rows, t0 = [], time.time()
    for i in range(1, steps + 1):
        params, opt, loss = step(params, opt, *copy_batch(rng, batch, length, vocab))
        if i % log_every == 0 or i == steps:
            rows.append((i, float(loss), time.time() - t0))
    return rows
