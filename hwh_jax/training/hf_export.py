"""A trained run as a Hugging Face folder (``python -m launch.export_hf``).

A model whose every layer holds RoPE full-attention heads only (the project's Transformer, and
models imported from Llama checkpoints) is Llama's architecture: RMSNorm before attention and
before a SwiGLU, RoPE with the two halves of a head rotated together, tied or untied
embeddings, GQA. Its export is a standard ``LlamaForCausalLM`` folder that ``transformers``
loads without remote code:

    config.json          LlamaConfig (the run's sizes, rope theta and scaling, eps, tying)
    model.safetensors    the weights in float32 or bfloat16, HF's names and [out, in] layout
    generation_config.json
    tokenizer files      GPT-2 BPE as GPT2TokenizerFast (vocab.json, merges.txt)

The names are the inverse of ``hwh_jax.analysis.hf_import`` (which reads such a folder back:
the round trip is exact). Head-wise hybrids, linear-attention heads, NoPE heads, sliding
windows, per-head q/k norms and models without an MLP have no PyTorch form here yet: their
export is refused in one line naming what stands in the way.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import jax
import numpy as np
from flax import nnx

from hwh_jax import storage
from hwh_jax.analysis.hf_import import our_path, param_path
from hwh_jax.data.paths import resolve
from hwh_jax.layers.config import ModelConfig

DTYPES = ("float32", "bfloat16")


def exportable(cfg: ModelConfig) -> str | None:
    """None if ``cfg`` has a Llama form, else what stands in the way (one phrase)."""
    for l, spec in enumerate(cfg.layers):
        if spec.num_la:
            return f"layer {l} has {spec.num_la} linear-attention heads ({cfg.la_kind})"
        if not spec.fa_rope:
            return f"layer {l}'s attention heads are NoPE"
        if spec.window is not None:
            return f"layer {l}'s attention has a sliding window ({spec.window})"
    if cfg.qk_norm:
        return "the attention heads normalise q and k (Qwen3's form)"
    if not cfg.mlp_hidden:
        return "the blocks have no MLP (model.mlp_hidden=0)"
    if cfg.abs_positions:
        return "the model has learned absolute positions (model.abs_positions)"
    if cfg.rope_pairing != "half":
        return f"rope_pairing={cfg.rope_pairing!r} (Llama rotates the two halves: 'half')"
    return None


def llama_config(cfg: ModelConfig, *, max_positions: int, tokenizer, dtype: str) -> dict:
    """config.json of the Llama form of ``cfg``."""
    scaling = dict(cfg.rope_scaling) if cfg.rope_scaling else None
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "intermediate_size": cfg.mlp_hidden,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.layers[0].num_fa,
        "num_key_value_heads": cfg.layers[0].num_fa // cfg.q_per_kv,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": max_positions,
        "rms_norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": scaling,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": cfg.tie_embeddings,
        "bos_token_id": tokenizer.eos_id,
        "eos_token_id": tokenizer.eos_id,
        "torch_dtype": dtype,
    }


def llama_tensors(model, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """HF name -> array of every parameter of ``model``: the names Llama's checkpoints hold,
    each placed (and transposed to [out, in]) by the importer's own table
    (``hf_import.our_path``), so export and import cannot disagree."""
    params = nnx.state(model, nnx.Param)
    ours = {
        param_path(p): np.asarray(x) for p, x in jax.tree_util.tree_flatten_with_path(params)[0]
    }
    names = ["model.embed_tokens.weight", "model.norm.weight"]
    names += [] if cfg.tie_embeddings else ["lm_head.weight"]
    for l in range(cfg.num_layers):
        hf = f"model.layers.{l}"
        names += [f"{hf}.input_layernorm.weight", f"{hf}.post_attention_layernorm.weight"]
        names += [f"{hf}.self_attn.{p}_proj.weight" for p in "qkvo"]
        names += [f"{hf}.mlp.{p}_proj.weight" for p in ("gate", "up", "down")]
    out = {}
    for name in names:
        path, transpose = our_path(name)
        x = ours.pop(path)
        out[name] = x.T if transpose else x
    if ours:
        raise ValueError(f"parameters without a place in the Llama form: {sorted(ours)[:4]}")
    return out


def check_tokenizer(tokenizer):
    """Refuse (one line) a tokenizer without an exact ``transformers`` form."""
    if tokenizer.name != "gpt2_bpe":
        raise ValueError(
            f"tokenizer {tokenizer.name!r} has no exact transformers form here yet (a "
            f"SentencePiece model converted by transformers splits whitespace and newlines "
            f"otherwise); runs with data.tokenizer='gpt2' export"
        )


def write_tokenizer(tokenizer, out: Path) -> list[str]:
    """The run's tokenizer as ``transformers`` files; the names written."""
    check_tokenizer(tokenizer)
    folder = resolve("gpt2_bpe")
    vocab = gzip.decompress((folder / "encoder.json.gz").read_bytes())
    merges = gzip.decompress((folder / "vocab.bpe.gz").read_bytes())
    (out / "vocab.json").write_bytes(vocab)
    (out / "merges.txt").write_bytes(merges)
    eos = "<|endoftext|>"
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "GPT2Tokenizer",
                "bos_token": eos,
                "eos_token": eos,
                "unk_token": eos,
                "add_prefix_space": False,
                "model_max_length": 1_000_000,
            },
            indent=2,
        )
    )
    return ["vocab.json", "merges.txt", "tokenizer_config.json"]


def export_llama(
    model, cfg: ModelConfig, tokenizer, out, *, max_positions: int, dtype: str = "float32"
) -> list[str]:
    """Write the Llama form of ``model`` into the folder ``out``; the file names written."""
    from safetensors.numpy import save_file

    if dtype not in DTYPES:
        raise ValueError(f"--dtype={dtype!r}: one of {DTYPES}")
    why = exportable(cfg)
    if why is not None:
        raise ValueError(
            f"model.arch={cfg.arch!r} has no PyTorch form here yet: {why}. Exportable: models "
            f"of RoPE attention heads only (the transformer architecture)"
        )
    check_tokenizer(tokenizer)  # refused before anything is written
    staged = storage.Staged(out)  # a bucket's folder is written locally, then uploaded
    out = staged.local
    np_dtype = np.float32
    if dtype == "bfloat16":
        import ml_dtypes

        np_dtype = ml_dtypes.bfloat16
    tensors = {
        k: np.ascontiguousarray(v.astype(np_dtype)) for k, v in llama_tensors(model, cfg).items()
    }
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = llama_config(cfg, max_positions=max_positions, tokenizer=tokenizer, dtype=dtype)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    generation = {"bos_token_id": tokenizer.eos_id, "eos_token_id": tokenizer.eos_id}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2))
    names = ["config.json", "model.safetensors", "generation_config.json"]
    names += write_tokenizer(tokenizer, out)
    staged.sync()
    return names
