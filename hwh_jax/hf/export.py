"""A trained run as a Hugging Face folder (``python -m launch.export_hf``).

Two forms, chosen by the architecture (``export``):

- **Llama**: a model whose every layer holds RoPE full-attention heads only (the project's
  Transformer, models imported from Llama checkpoints): RMSNorm before attention and before a
  SwiGLU, RoPE with the two halves of a head rotated together, GQA. A standard
  ``LlamaForCausalLM`` folder that ``transformers`` loads without remote code. The names are the
  inverse of ``hwh_jax.hf.load`` (the round trip is exact).
- **HwH**: every other model whose linear heads have a PyTorch form here (GDN, DeltaNet,
  Lightning, RetNet): head-wise and layer-wise hybrids, pure linear-attention models, NoPE
  heads, sliding windows, q/k norms, no MLP, learned positions. The folder carries the modeling
  code (``hwh_jax/hf/modeling``: ``HwhConfig``, ``HwhForCausalLM``, pure PyTorch), which
  ``transformers`` loads with ``trust_remote_code=True``; ``import_hwh`` reads it back exactly.

Both write ``config.json``, ``model.safetensors`` (float32 or bfloat16, [out, in] layout),
``generation_config.json`` and the tokenizer (GPT-2 BPE as ``GPT2Tokenizer``: vocab.json,
merges.txt; SentencePiece as tokenizer.model with ``tokenization_hwh.py``, remote code that
encodes with SentencePiece itself). Mamba-2, GLA, HGRN and HGRN-2 heads are refused in one line
naming what stands in the way.
"""

from __future__ import annotations

import gzip
import json
import re
import shutil
from pathlib import Path

import jax
import numpy as np
from flax import nnx

from hwh_jax import storage
from hwh_jax.data.paths import resolve
from hwh_jax.hf.load import our_path, param_path
from hwh_jax.layers import heads
from hwh_jax.layers.config import LayerSpec, ModelConfig

DTYPES = ("float32", "bfloat16")
MODELING_DIR = Path(__file__).parent / "modeling"  # local path: the PyTorch code a folder carries
MODELING = ("configuration_hwh.py", "modeling_hwh.py")


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
    (``load.our_path``), so export and import cannot disagree."""
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
    """Refuse (one line) a tokenizer without a ``transformers`` form here."""
    if tokenizer.name != "gpt2_bpe" and not tokenizer.name.startswith("sp_"):
        raise ValueError(f"tokenizer {tokenizer.name!r} has no transformers form here")


def write_tokenizer(tokenizer, out: Path) -> list[str]:
    """The run's tokenizer as ``transformers`` files; the names written. GPT-2 BPE: GPT-2's
    own vocab.json and merges.txt. SentencePiece: its ``.model`` as tokenizer.model and
    ``tokenization_hwh.py`` (remote code that encodes with SentencePiece itself: the ids equal
    the project's; transformers' conversion into a fast tokenizer splits runs of spaces and
    newlines otherwise). Both as the project encodes: special-token strings in a text are
    text (``split_special_tokens``), and the start token is the end-of-text token, with which
    the project begins a text it scores (``bos_token`` = ``eos_token``)."""
    check_tokenizer(tokenizer)
    if tokenizer.name.startswith("sp_"):
        sp = tokenizer.sp
        piece = lambda i: sp.id_to_piece(int(i)) if 0 <= int(i) < sp.get_piece_size() else None
        shutil.copyfile(storage.local_copy(tokenizer.model_path), out / "tokenizer.model")
        shutil.copyfile(MODELING_DIR / "tokenization_hwh.py", out / "tokenization_hwh.py")
        config = {
            "tokenizer_class": "HwhSentencePieceTokenizer",
            "auto_map": {"AutoTokenizer": ["tokenization_hwh.HwhSentencePieceTokenizer", None]},
            "eos_token": piece(sp.eos_id()),
            "unk_token": piece(sp.unk_id()),
            "pad_token": piece(sp.pad_id()),
            "bos_token": piece(sp.eos_id()),
            "split_special_tokens": True,
            "model_max_length": 1_000_000,
        }
        (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
        return ["tokenizer.model", "tokenization_hwh.py", "tokenizer_config.json"]
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
                "split_special_tokens": True,
                "model_max_length": 1_000_000,
            },
            indent=2,
        )
    )
    return ["vocab.json", "merges.txt", "tokenizer_config.json"]


def hwh_exportable(cfg: ModelConfig) -> str | None:
    """None if ``cfg`` has the HwH form (``modeling_hwh.py``), else what stands in the way."""
    if any(spec.num_la for spec in cfg.layers) and not heads.get(cfg.la_kind).torch_form:
        with_form = [k for k in heads.names() if heads.get(k).torch_form]
        return f"its linear heads are {cfg.la_kind!r} (the PyTorch form has {with_form})"
    return None


def hwh_config(cfg: ModelConfig, *, max_positions: int, tokenizer, dtype: str) -> dict:
    """config.json of the HwH form of ``cfg``: ``HwhConfig``'s fields (they are
    ``ModelConfig``'s), the classes to load by ``auto_map``."""
    return {
        "architectures": ["HwhForCausalLM"],
        "model_type": "hwh",
        "auto_map": {
            "AutoConfig": "configuration_hwh.HwhConfig",
            "AutoModelForCausalLM": "modeling_hwh.HwhForCausalLM",
        },
        "hwh_arch": cfg.arch,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "intermediate_size": cfg.mlp_hidden,
        "num_heads": cfg.num_heads,
        "head_dim": cfg.head_dim,
        "layers": [
            {"num_fa": s.num_fa, "num_la": s.num_la, "fa_rope": s.fa_rope, "window": s.window}
            for s in cfg.layers
        ],
        "q_per_kv": cfg.q_per_kv,
        "qk_norm": cfg.qk_norm,
        "rope_base": cfg.rope_theta,
        "rope_pairing": cfg.rope_pairing,
        "rope_freq_scaling": dict(cfg.rope_scaling) if cfg.rope_scaling else None,
        "la_kind": cfg.la_kind,
        "la_key_dim": cfg.la_key_dim,
        "la_value_dim": cfg.la_value_dim,
        "la_short_conv": cfg.la_short_conv,
        "conv_size": cfg.conv_size,
        "la_chunk_size": cfg.la_chunk_size,
        "rms_norm_eps": cfg.norm_eps,
        "abs_positions": cfg.abs_positions,
        "max_position_embeddings": max_positions,
        "tie_word_embeddings": cfg.tie_embeddings,
        "bos_token_id": tokenizer.eos_id,
        "eos_token_id": tokenizer.eos_id,
        "torch_dtype": dtype,
    }


def config_from_hwh(hf: dict, *, dtype: str = "float32") -> ModelConfig:
    """The ``ModelConfig`` of an HwH-form config.json (the inverse of ``hwh_config``)."""
    layers = tuple(
        LayerSpec(int(l["num_fa"]), int(l["num_la"]), bool(l["fa_rope"]), l["window"])
        for l in hf["layers"]
    )
    return ModelConfig(
        vocab_size=hf["vocab_size"],
        d_model=hf["hidden_size"],
        num_heads=hf["num_heads"],
        head_dim=hf["head_dim"],
        la_key_dim=hf["la_key_dim"],
        la_value_dim=hf["la_value_dim"],
        mlp_hidden=hf["intermediate_size"],
        layers=layers,
        arch=hf.get("hwh_arch", "custom"),
        q_per_kv=hf["q_per_kv"],
        qk_norm=hf["qk_norm"],
        rope_theta=hf["rope_base"],
        rope_pairing=hf["rope_pairing"],
        rope_scaling=tuple(sorted((hf["rope_freq_scaling"] or {}).items())),
        conv_size=hf["conv_size"],
        tie_embeddings=hf["tie_word_embeddings"],
        abs_positions=hf["abs_positions"],
        norm_eps=hf["rms_norm_eps"],
        dtype=dtype,
        la_chunk_size=hf["la_chunk_size"],
        la_kind=hf["la_kind"],
        la_short_conv=hf["la_short_conv"],
    )


_CONV = re.compile(r"(^|/)[qkv]_conv/kernel$")


def torch_name(path: str) -> tuple[str, str]:
    """(name in ``HwhForCausalLM``'s state dict, layout change) of a parameter path of ours
    (``param_path``): "T" a [in, out] kernel stored [out, in], "conv" a [W, C] convolution
    stored [C, 1, W], "" as it is."""
    if path == "lm_head/kernel":
        return "lm_head.weight", "T"
    if path == "embed/embedding":
        return "model.embed.weight", ""
    how = ""
    if _CONV.search(path):
        path, how = path[: -len("/kernel")], "conv"
    elif path.endswith("/kernel"):
        path, how = path[: -len("/kernel")] + "/weight", "T"
    path = path.replace("o_norm/norm/weight", "o_norm/weight")
    return "model." + path.replace("/", "."), how


def _to_torch(x: np.ndarray, how: str) -> np.ndarray:
    if how == "T":
        return x.T
    if how == "conv":
        return x.T[:, None, :]
    return x


def _from_torch(x: np.ndarray, how: str) -> np.ndarray:
    if how == "T":
        return x.T
    if how == "conv":
        return x[:, 0, :].T
    return x


def hwh_tensors(model) -> dict[str, np.ndarray]:
    """Torch name -> array of every parameter of ``model`` in ``HwhForCausalLM``'s layout."""
    params = nnx.state(model, nnx.Param)
    out = {}
    for p, x in jax.tree_util.tree_flatten_with_path(params)[0]:
        name, how = torch_name(param_path(p))
        out[name] = _to_torch(np.asarray(x), how)
    return out


def import_hwh(folder, *, dtype: str = "float32"):
    """(HybridLM, ModelConfig) of an HwH-form folder: the weights as exported, back in place."""
    from safetensors.numpy import load_file

    from hwh_jax.models.lm import HybridLM

    folder = Path(folder)  # local path: safetensors memory-maps local files
    cfg = config_from_hwh(json.loads((folder / "config.json").read_text()), dtype=dtype)
    model = HybridLM(cfg, rngs=nnx.Rngs(0))
    tensors = load_file(str(folder / "model.safetensors"))
    state = nnx.state(model, nnx.Param)
    leaves, tree = jax.tree_util.tree_flatten_with_path(state)
    new = []
    for p, x in leaves:
        name, how = torch_name(param_path(p))
        if name not in tensors:
            raise ValueError(f"{folder}/model.safetensors has no {name} (our {param_path(p)})")
        y = _from_torch(np.asarray(tensors.pop(name), np.float32), how)
        if y.shape != x.shape:
            raise ValueError(f"{name}: shape {y.shape} where the config gives {x.shape}")
        new.append(y.astype(x.dtype))
    if tensors:
        raise ValueError(f"tensors without a place in the model: {sorted(tensors)[:4]}")
    nnx.update(model, jax.tree_util.tree_unflatten(tree, new))
    return model, cfg


def export(
    model,
    cfg: ModelConfig,
    tokenizer,
    out,
    *,
    max_positions: int,
    dtype: str = "float32",
    trained_length: int | None = None,
) -> tuple[str, list[str]]:
    """Write ``model`` into the folder ``out`` in its form (module docstring): (the form,
    "llama" or "hwh"; the file names written). ``max_positions``: config.json's
    ``max_position_embeddings``, the longest input a reader of the folder is told it takes
    (lm-eval's ``hf`` model cuts its inputs to it); ``trained_length``: the run's sequence
    length, written beside it as ``trained_length``."""
    kw = dict(max_positions=max_positions, dtype=dtype, trained_length=trained_length)
    if exportable(cfg) is None:
        return "llama", export_llama(model, cfg, tokenizer, out, **kw)
    return "hwh", export_hwh(model, cfg, tokenizer, out, **kw)


def _write(out, tensors, config, tokenizer, dtype, extra=(), trained_length=None) -> list[str]:
    """The folder's files: weights in ``dtype``, config (with ``trained_length`` where given),
    generation config, tokenizer, and ``extra`` files copied from hwh_jax/hf/modeling."""
    if trained_length:
        config = {**config, "trained_length": int(trained_length)}
    from safetensors.numpy import save_file

    staged = storage.Staged(out)  # a bucket's folder is written locally, then uploaded
    local = staged.local
    np_dtype = np.float32
    if dtype == "bfloat16":
        import ml_dtypes

        np_dtype = ml_dtypes.bfloat16
    tensors = {k: np.ascontiguousarray(v.astype(np_dtype)) for k, v in tensors.items()}
    save_file(tensors, str(local / "model.safetensors"), metadata={"format": "pt"})
    (local / "config.json").write_text(json.dumps(config, indent=2))
    generation = {"bos_token_id": tokenizer.eos_id, "eos_token_id": tokenizer.eos_id}
    (local / "generation_config.json").write_text(json.dumps(generation, indent=2))
    names = ["config.json", "model.safetensors", "generation_config.json"]
    names += write_tokenizer(tokenizer, local)
    source = MODELING_DIR
    for name in extra:
        shutil.copyfile(source / name, local / name)
        names.append(name)
    for name in names:  # readable by all, as the other files of a model folder (safetensors
        (local / name).chmod(0o644)  # writes its file for its owner alone)
    staged.sync()
    return names


def export_hwh(
    model,
    cfg: ModelConfig,
    tokenizer,
    out,
    *,
    max_positions: int,
    dtype: str = "float32",
    trained_length: int | None = None,
) -> list[str]:
    """Write the HwH form of ``model`` (``HwhForCausalLM``, its modeling code beside the
    weights) into the folder ``out``; the file names written."""
    if dtype not in DTYPES:
        raise ValueError(f"--dtype={dtype!r}: one of {DTYPES}")
    why = hwh_exportable(cfg)
    if why is not None:
        raise ValueError(f"model.arch={cfg.arch!r} has no PyTorch form here yet: {why}")
    check_tokenizer(tokenizer)  # refused before anything is written
    config = hwh_config(cfg, max_positions=max_positions, tokenizer=tokenizer, dtype=dtype)
    return _write(out, hwh_tensors(model), config, tokenizer, dtype, MODELING, trained_length)


def export_llama(
    model,
    cfg: ModelConfig,
    tokenizer,
    out,
    *,
    max_positions: int,
    dtype: str = "float32",
    trained_length: int | None = None,
) -> list[str]:
    """Write the Llama form of ``model`` into the folder ``out``; the file names written."""
    if dtype not in DTYPES:
        raise ValueError(f"--dtype={dtype!r}: one of {DTYPES}")
    why = exportable(cfg)
    if why is not None:
        raise ValueError(
            f"model.arch={cfg.arch!r} has no Llama form: {why}. Models of RoPE attention heads "
            f"only (the transformer architecture) have it; the others export in the HwH form"
        )
    check_tokenizer(tokenizer)  # refused before anything is written
    config = llama_config(cfg, max_positions=max_positions, tokenizer=tokenizer, dtype=dtype)
    return _write(out, llama_tensors(model, cfg), config, tokenizer, dtype, (), trained_length)
