"""Log-likelihood of continuations given contexts, as lm-evaluation-harness scores them.

A request is (context ids, continuation ids). Context + continuation are run through the model
in one causal pass (left-truncated to ``max_len``); the score is the summed log-probability of
the continuation tokens and whether each of them is the argmax (``is_greedy``). Requests are
sorted by length and padded on the right to a few bucket lengths, so few shapes compile.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx


class Scorer:
    """A model's per-token log-probabilities and greedy predictions over batches of token
    sequences, jitted once per bucketed length (for perplexity, MQAR, commonsense, probes)."""

    def __init__(self, model, *, batch_size: int = 32, bucket: int = 64, max_len: int = 4096):
        self.graphdef, self.state = nnx.split(model)
        self.batch_size, self.bucket, self.max_len = batch_size, bucket, max_len
        self._fwd = jax.jit(self._token_logprobs)
        self._argmax = jax.jit(lambda state, t: jnp.argmax(nnx.merge(self.graphdef, state)(t), -1))

    def _token_logprobs(self, state, tokens, targets):
        logits = nnx.merge(self.graphdef, state)(tokens)
        logp = jax.nn.log_softmax(logits, axis=-1)
        picked = jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
        return picked, jnp.argmax(logits, axis=-1) == targets

    def token_logprobs(self, tokens: np.ndarray):
        """tokens [B, T] -> (log p(token_t | <t) [B, T-1], greedy flags [B, T-1]) as numpy."""
        tokens = jnp.asarray(tokens, jnp.int32)
        lp, greedy = self._fwd(self.state, tokens[:, :-1], tokens[:, 1:])
        return np.asarray(lp), np.asarray(greedy)

    def argmax(self, tokens: np.ndarray) -> np.ndarray:
        """tokens [n <= batch_size, T] -> the model's argmax next token at every position."""
        n = len(tokens)
        padded = np.zeros((self.batch_size, tokens.shape[1]), np.int32)
        padded[:n] = tokens
        return np.asarray(self._argmax(self.state, jnp.asarray(padded)))[:n]

    def loglikelihood(self, requests, progress=None):
        """requests: list of (context ids, continuation ids) -> list of (sum logp, is_greedy)."""
        seqs = []
        for ctx, cont in requests:
            if not cont:
                raise ValueError("loglikelihood: an empty continuation cannot be scored")
            whole = (list(ctx) + list(cont))[-(self.max_len + 1) :]
            seqs.append((whole, len(cont)))
        order = sorted(range(len(seqs)), key=lambda i: -len(seqs[i][0]))
        results = [None] * len(seqs)
        for n, s in enumerate(range(0, len(order), self.batch_size)):
            idx = order[s : s + self.batch_size]
            L = -(-len(seqs[idx[0]][0]) // self.bucket) * self.bucket
            tokens = np.zeros((self.batch_size, L + 1), np.int32)  # fixed batch: one shape per L
            for r, i in enumerate(idx):
                tokens[r, : len(seqs[i][0])] = seqs[i][0]
            lp, greedy = self.token_logprobs(tokens)
            for r, i in enumerate(idx):
                whole, n_cont = seqs[i]
                sl = slice(len(whole) - 1 - n_cont, len(whole) - 1)
                results[i] = (float(lp[r, sl].sum()), bool(greedy[r, sl].all()))
            if progress is not None:
                progress(min(s + self.batch_size, len(order)), len(order))
        return results
