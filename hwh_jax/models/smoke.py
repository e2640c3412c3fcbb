"""One jitted forward pass of a freshly initialised model: the cheapest end-to-end check."""

from __future__ import annotations

import math
import time

import jax
import optax
from flax import nnx

import kernels_pallas
from hwh_jax.layers.config import ModelConfig
from hwh_jax.models.lm import HybridLM


def forward_once(cfg: ModelConfig, *, seq_len: int, batch: int = 2, seed: int = 0) -> str:
    """Init, run one forward on random tokens, report loss vs ln(vocab) and timings."""
    t0 = time.time()
    model = HybridLM(cfg, rngs=nnx.Rngs(seed))
    tokens = jax.random.randint(jax.random.key(seed + 1), (batch, seq_len + 1), 0, cfg.vocab_size)

    @nnx.jit
    def loss_fn(model, tokens):
        logits = model(tokens[:, :-1])
        return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

    loss = float(loss_fn(model, tokens))
    t1 = time.time()
    loss_fn(model, tokens).block_until_ready()
    t2 = time.time()
    if not math.isfinite(loss):
        raise FloatingPointError(f"forward pass gave a non-finite loss {loss}")
    return (
        f"forward [B={batch}, T={seq_len}] on {jax.default_backend()}: loss at init "
        f"{loss:.4f} (ln vocab = {math.log(cfg.vocab_size):.4f}); init+compile+run "
        f"{t1 - t0:.1f}s, run {1e3 * (t2 - t1):.0f}ms; kernels {kernels_pallas.chosen()}"
    )
