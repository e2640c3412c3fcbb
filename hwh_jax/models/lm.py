"""Decoder-only language model over a per-layer head allocation.

    h_0 = Embed(tokens)
    h_l = h_{l-1} + Mixer_l(RMSNorm(h_{l-1}));  h_l += SwiGLU(RMSNorm(h_l))     l = 1..L
    logits = LMHead(RMSNorm(h_L))                    (tied to the embedding by default)

Each residual add is done by the norm after it (``RMSNorm.add``: one pass on the GPU), so a
block takes the stream and the previous block's MLP output not yet added (``Block.residual``).

Mixer_l is the head-wise mixer of ``LayerSpec`` l (``hwh_jax.layers.mixer``). Parameters are
``ModelConfig.param_dtype`` (fp32), activations ``ModelConfig.dtype`` (bf16), logits fp32.

Inference: ``init_cache(batch, max_len)`` then ``extend(tokens, cache)`` any number of times
(a prompt, a chunk of one, or one token): the cache holds the time ``t`` of the next token, the
per-row first time ``start`` (rows are left-padded to a common length) and one entry per layer.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from hwh_jax.layers import embedding, remat
from hwh_jax.layers.config import LayerSpec, ModelConfig
from hwh_jax.layers.linear import INIT_STD, dense, matmul
from hwh_jax.layers.mixer import HeadwiseMixer
from hwh_jax.layers.mlp import SwiGLU
from hwh_jax.layers.norms import RMSNorm
from hwh_jax.layers.variables import data, partitioned
from kernels_pallas.sharding import constrain


class Block(nnx.Module):
    """One pre-norm residual layer [B, T, d] -> [B, T, d]:
    h = x + Mixer(RMSNorm(x)), then h + SwiGLU(RMSNorm(h)); the mixer is the ``LayerSpec``'s
    head-wise mixer. ``residual`` defers each add to the norm after it (one pass on a GPU)."""

    def __init__(self, cfg: ModelConfig, spec: LayerSpec, *, layer: int = 0, rngs: nnx.Rngs):
        norm_kw = dict(
            eps=cfg.norm_eps,
            dtype=cfg.compute_dtype,
            param_dtype=cfg.weight_dtype,
            settings=cfg.norm_settings(),
        )
        self.mixer_norm = RMSNorm(cfg.d_model, **norm_kw)
        self.mixer = HeadwiseMixer(cfg, spec, layer=layer, rngs=rngs)
        self.mlp_norm = self.mlp = data(None)  # model.mlp_hidden = 0: the mixer alone
        if cfg.mlp_hidden:
            self.mlp_norm = RMSNorm(cfg.d_model, **norm_kw)
            self.mlp = SwiGLU(
                cfg.d_model,
                cfg.mlp_hidden,
                out_std=INIT_STD / math.sqrt(2 * cfg.num_layers),
                dtype=cfg.compute_dtype,
                param_dtype=cfg.weight_dtype,
                matmul_settings=cfg.matmul_settings(),
                rngs=rngs,
            )

    def __call__(self, x, positions, segment_ids=None):
        x, delta = self.residual(x, None, positions, segment_ids)
        return x + delta

    def residual(self, x, delta, positions, segment_ids=None):
        """(stream after the mixer's add, MLP output) from the stream x and the previous
        block's MLP output ``delta`` (None: already in x), which is added here. Without an MLP
        the mixer's output is the ``delta`` the next norm adds."""
        # named scopes group the device time by part (hwh_jax/profiling/profile.py, OP_GROUPS)
        with jax.named_scope("norm"):
            x, y = self.mixer_norm.add(x, delta)
        with jax.named_scope("mixer"):
            y = self.mixer(y, positions, segment_ids)
        if self.mlp is None:
            return constrain(x), constrain(y)
        with jax.named_scope("norm"):
            x, y = self.mlp_norm.add(constrain(x), y)
        with jax.named_scope("mlp"):
            y = self.mlp(y)
        return constrain(x), constrain(y)

    def input_weights(self):
        """(the mixer's, the MLP's) input weights concatenated, for ``extend``."""
        return self.mixer.input_weight(), None if self.mlp is None else self.mlp.input_weight()

    def extend(self, x, delta, t0, start, valid, cache, fresh: bool = False, weights=None):
        """``residual``'s step over the cache: (stream after the mixer's add, MLP output, new
        cache) from the stream x and the previous block's MLP output ``delta`` (None: already
        in x); each add goes into the norm after it, as in training. ``weights``:
        ``input_weights()`` if already formed."""
        mixer_w, mlp_w = (None, None) if weights is None else weights
        x, h = self.mixer_norm.add(x, delta)
        y, cache = self.mixer.extend(h, t0, start, valid, cache, fresh, mixer_w)
        if self.mlp is None:
            return x, y, cache
        x, h = self.mlp_norm.add(x, y)
        return x, self.mlp.extend(h, mlp_w), cache


class HybridLM(nnx.Module):
    """The decoder-only LM of a ``ModelConfig`` (module docstring), tokens [B, T] -> logits
    [B, T, vocab] fp32:

    1. ``embed_tokens``: rows of the fp32 table, cast to the compute dtype -> [B, T, d].
    2. For each layer's ``Block`` (its ``LayerSpec``): x + Mixer(RMSNorm(x)), then
       + SwiGLU(RMSNorm(.)); each add is carried into the next norm (``Block.residual``).
    3. ``final_norm`` -> h [B, T, d] (``hidden``); ``logits``: h @ the head (the embedding
       transposed when tied, ``head_weight``).

    Inference: ``init_cache`` and ``extend`` (prompt chunks or single tokens over a cache)."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        init = partitioned(nnx.initializers.normal(INIT_STD), ("vocab", "embed"))
        self.embed = nnx.Embed(
            cfg.vocab_size,
            cfg.d_model,
            dtype=cfg.compute_dtype,
            param_dtype=cfg.weight_dtype,
            embedding_init=init,
            rngs=rngs,
        )
        self.positions = data(None)  # model.abs_positions: learned absolute positions
        if cfg.abs_positions:
            self.positions = nnx.Param(
                partitioned(nnx.initializers.normal(INIT_STD), (None, "embed"))(
                    rngs.params(), (cfg.abs_positions, cfg.d_model), cfg.weight_dtype
                )
            )
        self.blocks = nnx.List(
            [Block(cfg, spec, layer=l, rngs=rngs) for l, spec in enumerate(cfg.layers)]
        )
        self.final_norm = RMSNorm(
            cfg.d_model,
            eps=cfg.norm_eps,
            dtype=cfg.compute_dtype,
            param_dtype=cfg.weight_dtype,
            settings=cfg.norm_settings(),
        )
        self.lm_head = data(
            None
            if cfg.tie_embeddings
            else dense(
                cfg.d_model,
                cfg.vocab_size,
                ("embed", "vocab"),
                dtype=cfg.compute_dtype,
                param_dtype=cfg.weight_dtype,
                rngs=rngs,
            )
        )

    def embed_tokens(self, tokens):
        """tokens [...] int -> their rows of the embedding table [..., d] in the compute dtype,
        gathered from the table in its own dtype and cast after. ``nnx.Embed`` casts the whole
        table first, so its backward scatter-adds the rows' gradients in the compute dtype: in
        bf16 that sums thousands of a frequent token's rows in bf16, slowly and inexactly, on
        real text (where tokens collide; docs/benchmarks.md). Gathered first, the scatter-add
        runs in fp32. Under a mesh the lookup exchanges rows, not the table
        (``layers.embedding``)."""
        rows = embedding.lookup(self.embed.embedding[...], tokens)
        return rows.astype(self.cfg.compute_dtype)

    def embed_positions(self, x, positions):
        """x [B, T, d] plus the learned rows of ``positions`` ([1 or B, T]) where
        ``model.abs_positions`` is set (x as it is otherwise); positions past the table are an
        error naming the key (checked where T is known: a prompt longer than the table)."""
        if self.positions is None:
            return x
        table = self.positions[...]
        if x.shape[1] > table.shape[0]:
            raise ValueError(
                f"{x.shape[1]} positions do not fit model.abs_positions={table.shape[0]}"
            )
        rows = jnp.take(table, jnp.clip(positions, 0, table.shape[0] - 1), axis=0)
        return x + rows.astype(x.dtype)

    def hidden(self, tokens, positions=None, segment_ids=None):
        """tokens [B, T] int -> final hidden states [B, T, d] (after the final norm)."""
        if positions is None:
            positions = jnp.arange(tokens.shape[1])[None]
        with jax.named_scope("embed"):
            x = self.embed_positions(self.embed_tokens(tokens), positions)
        x, delta = constrain(x), None  # rows over the batch axes
        residual = remat.wrap(  # model.remat's policy
            _residual, self.cfg.remat, nnx.remat, self.cfg.kernel_platform
        )
        for block in self.blocks:
            x, delta = residual(block, x, delta, positions, segment_ids)
        with jax.named_scope("norm"):
            return self.final_norm.add(x, delta)[1]

    def logits(self, h, dtype=jnp.float32):
        """[B, T, d] -> logits [B, T, vocab] in ``dtype`` (None: the compute dtype)."""
        out = matmul(h.astype(self.cfg.compute_dtype), self.head_weight())
        return out if dtype is None else out.astype(dtype)

    def head_weight(self):
        """The LM head as a [d, vocab] matrix in the compute dtype (``logits(h)`` is h @ it;
        ``hwh_jax.layers.loss.head_loss`` takes it): the embedding transposed when tied."""
        if self.lm_head is None:
            return self.embed.embedding[...].astype(self.cfg.compute_dtype).T
        return self.lm_head.kernel[...].astype(self.cfg.compute_dtype)

    def __call__(self, tokens, positions=None, segment_ids=None):
        return self.logits(self.hidden(tokens, positions, segment_ids))

    # ------------------------------------------------------------ inference
    def init_cache(self, batch: int, max_len: int, *, start=None, dtype=None):
        """Empty cache for ``batch`` rows and at most ``max_len`` time steps; ``start`` [B]:
        the number of left-padding slots of each row (default none)."""
        dtype = self.cfg.compute_dtype if dtype is None else dtype
        if self.cfg.abs_positions and max_len > self.cfg.abs_positions:
            raise ValueError(  # a decode past the table would reuse its last row
                f"a cache of {max_len} time steps does not fit "
                f"model.abs_positions={self.cfg.abs_positions}"
            )
        start = jnp.zeros((batch,), jnp.int32) if start is None else jnp.asarray(start, jnp.int32)
        return {
            "t": jnp.int32(0),
            "start": start,
            "layers": [b.mixer.init_cache(batch, max_len, dtype) for b in self.blocks],
        }

    def input_weights(self):
        """Each block's input weights concatenated (``Block.input_weights``: the mixer's
        projections, the MLP's gate and up), for ``extend(..., input_weights=)``: a decode loop
        forms them once, not once a token."""
        return [b.input_weights() for b in self.blocks]

    def extend(
        self, tokens, cache, *, fresh: bool = False, last_only: bool = False, input_weights=None
    ):
        """tokens [B, Tn] at times cache["t"] ... -> (fp32 logits [B, Tn, vocab], new cache).

        ``fresh``: the cache is as ``init_cache`` made it (nothing written, t = 0): the FA
        heads attend over the chunk itself through the training attention, not over the cache.
        ``last_only``: logits of the last token only, [B, 1, vocab] (a prompt's prefill needs
        no more; all of a 32K prompt's would be 6.6 GB per row). ``input_weights``:
        ``input_weights()`` formed beforehand (default: each layer forms its own)."""
        t0, start = cache["t"], cache["start"]
        valid = (t0 + jnp.arange(tokens.shape[1]))[None] >= start[:, None]
        positions = t0 + jnp.arange(tokens.shape[1])[None] - start[:, None]  # from each row's start
        x, delta = self.embed_positions(self.embed_tokens(tokens), positions), None
        layers = []
        weights = input_weights or [None] * len(self.blocks)
        for block, c, w in zip(self.blocks, cache["layers"], weights):
            x, delta, c = block.extend(x, delta, t0, start, valid, c, fresh, w)
            layers.append(c)
        if last_only:
            x, delta = x[:, -1:], None if delta is None else delta[:, -1:]
        logits = self.logits(self.final_norm.add(x, delta)[1])
        return logits, {**cache, "t": t0 + tokens.shape[1], "layers": layers}


def _residual(block, x, delta, positions, segment_ids):
    """One block's step of the residual stream (a function of the block, for ``nnx.remat``)."""
    return block.residual(x, delta, positions, segment_ids)
