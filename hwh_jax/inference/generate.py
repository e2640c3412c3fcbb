"""Batched generation: left-padded prefill (optionally in chunks), then a jitted decode loop.

Prompts of different lengths are left-padded to a common length P (rounded up to
``length_multiple`` so that a handful of compiled shapes serve every prompt); row b's tokens
start at time ``start[b] = P - len(prompt_b)``. FA heads never see the padding and GDN heads
leave their state untouched by it, so each row decodes exactly as it would alone. The prompt's
first chunk (the whole prompt unless ``prefill_chunk``) runs ``fresh``: its FA heads attend over
the chunk itself through the training attention (cuDNN's on a GPU) instead of over the cache;
only the last token's logits are formed.

The Generator keeps its own copy of the model's matrices (every floating parameter of two or
more dimensions: projections, embedding, convolution kernels) in the compute dtype. Every layer
casts them to that dtype before use, so the outputs are the same bit for bit, while a decode
step at batch 1, bound by reading the weights, reads half the bytes of fp32 parameters and
skips their conversion (docs/benchmarks.md has the decode times). Its decode loop forms each
layer's concatenated input weights (the mixer's projections, the MLP's gate and up) once,
before its steps (``HybridLM.input_weights``), not once a token.
"""

from __future__ import annotations

import logging
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from hwh_jax.inference.sampling import sample

log = logging.getLogger(__name__)


def matrices_in(state, dtype):
    """``state`` with its floating parameters of ndim >= 2 cast to ``dtype`` (1-D ones such as
    norm scales, A_log and dt_bias, which some layers use in fp32, stay as they are)."""

    def cast(a):
        if a.ndim >= 2 and jnp.issubdtype(a.dtype, jnp.floating) and a.dtype != dtype:
            return a.astype(dtype)
        return a

    return jax.tree.map(cast, state)


class Generator:
    """Compiled prefill and decode for one model; call :meth:`generate` with token lists."""

    def __init__(
        self,
        model,
        *,
        eos_id: int | None = None,
        vocab: int | None = None,
        pad_id: int = 0,
        prefill_chunk: int = 0,
        length_multiple: int = 64,
        cache_len: int = 0,
    ):
        """``cache_len`` > 0 fixes the cache capacity (else padded prompt + new tokens): with
        ``prefill_chunk`` = ``length_multiple`` every prompt length then runs the same compiled
        init, prefill and decode (NIAH at several lengths compiles each once)."""
        if cache_len < 0 or prefill_chunk < 0 or length_multiple < 1:
            raise ValueError(
                f"Generator: cache_len {cache_len} and prefill_chunk "
                f"{prefill_chunk} must be >= 0, length_multiple {length_multiple} "
                f">= 1"
            )
        self.graphdef, state = nnx.split(model)
        self.state = matrices_in(state, model.cfg.compute_dtype)
        self.eos_id, self.vocab, self.pad_id = eos_id, vocab, pad_id
        self.prefill_chunk, self.length_multiple = prefill_chunk, length_multiple
        self.cache_len = cache_len
        # The compiled pieces, public so that benchmarks and tests time and call exactly what
        # ``generate`` runs: prefill(state, tokens, cache, fresh) -> (last logits, cache);
        # decode(state, logits, cache, key, steps=, temperature=, top_p=) -> (tokens, cache).
        # The cache is donated: a step updates it in place instead of holding two copies (a
        # 380m Transformer's 32K cache at batch 32 is 96 GiB).
        self.prefill = jax.jit(
            self._prefill_fn, donate_argnames=("cache",), static_argnames=("fresh",)
        )
        self.decode = jax.jit(
            self._decode_fn,
            static_argnames=("steps", "temperature", "top_p"),
            donate_argnames=("cache",),
        )
        self._init = jax.jit(self._init_fn, static_argnames=("batch", "max_len"))

    # ------------------------------------------------ jitted pieces
    def _init_fn(self, state, start, batch, max_len):
        return nnx.merge(self.graphdef, state).init_cache(batch, max_len, start=start)

    def _prefill_fn(self, state, tokens, cache, fresh=False):
        logits, cache = nnx.merge(self.graphdef, state).extend(
            tokens, cache, fresh=fresh, last_only=True
        )
        return logits[:, -1], cache

    def _decode_fn(self, state, logits, cache, key, *, steps, temperature, top_p):
        model = nnx.merge(self.graphdef, state)
        weights = model.input_weights()  # once, not once a step (HybridLM.input_weights)
        B = logits.shape[0]
        eos = -1 if self.eos_id is None else self.eos_id

        def body(i, carry):
            logits, cache, key, out, done = carry
            key, sub = jax.random.split(key)
            tok = sample(logits, sub, temperature=temperature, top_p=top_p, vocab=self.vocab)
            tok = jnp.where(done, self.pad_id, tok)
            out = out.at[:, i].set(tok)
            done = done | (tok == eos)
            logits, cache = model.extend(tok[:, None], cache, input_weights=weights)
            return logits[:, 0], cache, key, out, done

        out = jnp.full((B, steps), self.pad_id, jnp.int32)
        carry = (logits, cache, key, out, jnp.zeros((B,), bool))
        _, cache, _, out, _ = jax.lax.fori_loop(0, steps, body, carry)
        return out, cache

    # ------------------------------------------------ host side
    def padded_length(self, longest: int) -> int:
        m = self.length_multiple
        if self.prefill_chunk and longest > self.prefill_chunk:
            m = self.prefill_chunk
        return -(-longest // m) * m

    def generate(
        self,
        prompts,
        max_new_tokens: int,
        *,
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: int = 0,
    ):
        """prompts: list of token-id lists -> (list of generated id lists, timing dict).

        Generation of a row stops after ``eos_id`` (not included in its output)."""
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ValueError("generate: every prompt needs at least one token")
        if max_new_tokens < 1:
            raise ValueError(f"generate: max_new_tokens must be >= 1, got {max_new_tokens}")
        B = len(prompts)
        P = self.padded_length(max(len(p) for p in prompts))
        tokens = np.full((B, P), self.pad_id, np.int32)
        for b, p in enumerate(prompts):
            tokens[b, P - len(p) :] = p
        start = jnp.asarray([P - len(p) for p in prompts], jnp.int32)
        if self.cache_len and P + max_new_tokens > self.cache_len:
            raise ValueError(
                f"generate: padded prompt {P} + {max_new_tokens} new tokens exceed "
                f"the fixed cache_len {self.cache_len}"
            )
        t0 = time.perf_counter()
        cache = self._init(self.state, start, batch=B, max_len=self.cache_len or P + max_new_tokens)
        chunk = self.prefill_chunk if self.prefill_chunk and P > self.prefill_chunk else P
        for s in range(0, P, chunk):
            logits, cache = self.prefill(
                self.state, jnp.asarray(tokens[:, s : s + chunk]), cache, fresh=s == 0
            )
        logits.block_until_ready()
        t1 = time.perf_counter()
        out, _ = self.decode(
            self.state,
            logits,
            cache,
            jax.random.key(seed),
            steps=max_new_tokens,
            temperature=float(temperature),
            top_p=float(top_p),
        )
        out = np.asarray(out)
        t2 = time.perf_counter()
        results = []
        for row in out.tolist():
            if self.eos_id is not None and self.eos_id in row:
                row = row[: row.index(self.eos_id)]
            results.append(row)
        return results, {"prefill_s": t1 - t0, "decode_s": t2 - t1, "padded_prompt": P}


def generate(model, prompts, max_new_tokens: int, **kw):
    """One-off :class:`Generator` call; returns only the generated token lists."""
    gen_kw = {
        k: kw.pop(k)
        for k in ("eos_id", "vocab", "pad_id", "prefill_chunk", "length_multiple")
        if k in kw
    }
    return Generator(model, **gen_kw).generate(prompts, max_new_tokens, **kw)[0]
