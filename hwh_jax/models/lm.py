"""Decoder-only language model over a per-layer head allocation.

    h_0 = Embed(tokens)
    h_l = h_{l-1} + Mixer_l(RMSNorm(h_{l-1}));  h_l += SwiGLU(RMSNorm(h_l))     l = 1..L
    logits = LMHead(RMSNorm(h_L))                    (tied to the embedding by default)

Mixer_l is the head-wise mixer of ``LayerSpec`` l (``hwh_jax.layers.mixer``). Parameters are
``ModelConfig.param_dtype`` (fp32), activations ``ModelConfig.dtype`` (bf16), logits fp32.
"""
from __future__ import annotations

import math

import jax.numpy as jnp
from flax import nnx

from hwh_jax.layers.linear import INIT_STD, dense
from hwh_jax.layers.mixer import HeadwiseMixer
from hwh_jax.layers.mlp import SwiGLU
from hwh_jax.layers.norms import RMSNorm
from hwh_jax.layers.nnx_compat import data
from hwh_jax.models.config import LayerSpec, ModelConfig


class Block(nnx.Module):
    def __init__(self, cfg: ModelConfig, spec: LayerSpec, *, rngs: nnx.Rngs):
        norm_kw = dict(eps=cfg.norm_eps, dtype=cfg.compute_dtype, param_dtype=cfg.weight_dtype)
        self.mixer_norm = RMSNorm(cfg.d_model, **norm_kw)
        self.mixer = HeadwiseMixer(cfg, spec, rngs=rngs)
        self.mlp_norm = RMSNorm(cfg.d_model, **norm_kw)
        self.mlp = SwiGLU(cfg.d_model, cfg.mlp_hidden,
                          out_std=INIT_STD / math.sqrt(2 * cfg.num_layers),
                          dtype=cfg.compute_dtype, param_dtype=cfg.weight_dtype, rngs=rngs)

    def __call__(self, x, positions, segment_ids=None):
        x = x + self.mixer(self.mixer_norm(x), positions, segment_ids)
        return x + self.mlp(self.mlp_norm(x))


class HybridLM(nnx.Module):
    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        init = nnx.with_partitioning(nnx.initializers.normal(INIT_STD), ("vocab", "embed"))
        self.embed = nnx.Embed(cfg.vocab_size, cfg.d_model, dtype=cfg.compute_dtype,
                               param_dtype=cfg.weight_dtype, embedding_init=init, rngs=rngs)
        self.blocks = nnx.List([Block(cfg, spec, rngs=rngs) for spec in cfg.layers])
        self.final_norm = RMSNorm(cfg.d_model, eps=cfg.norm_eps, dtype=cfg.compute_dtype,
                                  param_dtype=cfg.weight_dtype)
        self.lm_head = data(None if cfg.tie_embeddings else dense(
            cfg.d_model, cfg.vocab_size, ("embed", "vocab"), dtype=cfg.compute_dtype,
            param_dtype=cfg.weight_dtype, rngs=rngs))

    def hidden(self, tokens, positions=None, segment_ids=None):
        """tokens [B, T] int -> final hidden states [B, T, d] (after the final norm)."""
        if positions is None:
            positions = jnp.arange(tokens.shape[1])[None]
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x, positions, segment_ids)
        return self.final_norm(x)

    def logits(self, h):
        """[B, T, d] -> fp32 logits [B, T, vocab]."""
        if self.lm_head is None:
            return self.embed.attend(h).astype(jnp.float32)
        return self.lm_head(h).astype(jnp.float32)

    def __call__(self, tokens, positions=None, segment_ids=None):
        return self.logits(self.hidden(tokens, positions, segment_ids))
