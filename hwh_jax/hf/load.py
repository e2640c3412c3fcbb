"""Import Hugging Face Qwen3 / Llama 3.x safetensors checkpoints into ``HybridLM``.

A folder with ``config.json`` and ``model.safetensors`` (or ``model.safetensors.index.json``
and its shards) becomes a HybridLM whose every layer holds RoPE FA heads only: GQA, Qwen3's
per-head q/k RMSNorm, Llama 3.1's "llama3" rope scaling, tied or untied embeddings. No
network: everything is read from the folder. Every tensor of the checkpoint must land in a
parameter and every parameter must be filled, else the import stops naming the tensor.

    HF name (layer l)                             HybridLM path
    model.embed_tokens.weight                     embed/embedding
    model.layers.l.input_layernorm.weight         blocks/l/mixer_norm/weight
    model.layers.l.self_attn.{q,k,v}_proj.weight  blocks/l/mixer/fa/{q,k,v}_proj/kernel (T)
    model.layers.l.self_attn.{q,k}_norm.weight    blocks/l/mixer/fa/{q,k}_norm/weight
    model.layers.l.self_attn.o_proj.weight        blocks/l/mixer/o_proj/kernel (T)
    model.layers.l.post_attention_layernorm.weight blocks/l/mlp_norm/weight
    model.layers.l.mlp.{gate,up,down}_proj.weight blocks/l/mlp/{gate,up,down}/kernel (T)
    model.norm.weight                             final_norm/weight
    lm_head.weight                                lm_head/kernel (T), absent when tied
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import jax
import jax.numpy as jnp
from flax import nnx

from hwh_jax.layers.config import LayerSpec, ModelConfig
from hwh_jax.models.lm import HybridLM

SUPPORTED = ("qwen3", "llama")

_RULES = [  # (HF regex, our path template, transpose)
    (r"model\.embed_tokens\.weight", "embed/embedding", False),
    (r"model\.norm\.weight", "final_norm/weight", False),
    (r"lm_head\.weight", "lm_head/kernel", True),
    (r"model\.layers\.(\d+)\.input_layernorm\.weight", "blocks/{0}/mixer_norm/weight", False),
    (
        r"model\.layers\.(\d+)\.post_attention_layernorm\.weight",
        "blocks/{0}/mlp_norm/weight",
        False,
    ),
    (
        r"model\.layers\.(\d+)\.self_attn\.([qkv])_proj\.weight",
        "blocks/{0}/mixer/fa/{1}_proj/kernel",
        True,
    ),
    (
        r"model\.layers\.(\d+)\.self_attn\.([qk])_norm\.weight",
        "blocks/{0}/mixer/fa/{1}_norm/weight",
        False,
    ),
    (r"model\.layers\.(\d+)\.self_attn\.o_proj\.weight", "blocks/{0}/mixer/o_proj/kernel", True),
    (r"model\.layers\.(\d+)\.mlp\.(gate|up|down)_proj\.weight", "blocks/{0}/mlp/{1}/kernel", True),
]


def _rope_scaling(hf: dict) -> tuple:
    params = hf.get("rope_scaling") or hf.get("rope_parameters") or {}
    keep = {k: v for k, v in params.items() if k != "rope_theta"}
    kind = keep.get("rope_type", keep.get("type", "default"))
    if kind not in ("default", "llama3"):
        raise ValueError(f"rope scaling {kind!r} is not supported (default, llama3)")
    return () if kind == "default" else tuple(sorted(keep.items()))


class _Keys(dict):
    """A config.json whose missing key names the file and the key."""

    def __init__(self, data: dict, where: str):
        super().__init__(data)
        self.where = where

    def __missing__(self, key):
        raise KeyError(
            f"{self.where}: no {key!r} (a {self.get('model_type', '?')} config needs it)"
        )


def config_from_hf(hf: dict, *, dtype: str = "float32") -> ModelConfig:
    hf = hf if isinstance(hf, _Keys) else _Keys(hf, "config.json")
    kind = hf.get("model_type")
    if kind not in SUPPORTED:
        raise ValueError(f"model_type {kind!r} is not supported; supported: {SUPPORTED}")
    if hf.get("attention_bias") or hf.get("mlp_bias"):
        raise ValueError("checkpoints with attention or MLP biases are not supported")
    H = hf["num_attention_heads"]
    kv = hf.get("num_key_value_heads") or H
    D = hf.get("head_dim") or hf["hidden_size"] // H
    theta = hf.get("rope_theta") or (hf.get("rope_parameters") or {}).get("rope_theta", 10000.0)
    return ModelConfig(
        vocab_size=hf["vocab_size"],
        d_model=hf["hidden_size"],
        num_heads=H,
        head_dim=D,
        la_key_dim=D,
        la_value_dim=D,
        mlp_hidden=hf["intermediate_size"],
        layers=tuple(
            LayerSpec(num_fa=H, num_la=0, fa_rope=True) for _ in range(hf["num_hidden_layers"])
        ),
        arch=f"hf_{kind}",
        q_per_kv=H // kv,
        qk_norm=kind == "qwen3",
        rope_theta=float(theta),
        rope_pairing="half",
        rope_scaling=_rope_scaling(hf),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        dtype=dtype,
        param_dtype=dtype,
    )


def _tensors(folder: Path):
    from safetensors import safe_open

    index = folder / "model.safetensors.index.json"
    files = (
        sorted(set(json.loads(index.read_text())["weight_map"].values()))
        if index.exists()
        else ["model.safetensors"]
    )
    for name in files:
        if not (folder / name).exists():
            raise FileNotFoundError(f"{folder / name} (listed by the checkpoint) is missing")
        try:
            handle = safe_open(folder / name, framework="flax")
        except Exception as e:  # noqa: BLE001 - safetensors raises its own error types
            raise ValueError(f"{folder / name}: not a readable safetensors file ({e})") from None
        with handle as f:
            for key in f.keys():
                yield key, f.get_tensor(key)


def our_path(name: str):
    """(our parameter path, whether the tensor is transposed) of a checkpoint tensor name."""
    for pattern, template, transpose in _RULES:
        m = re.fullmatch(pattern, name)
        if m:
            return template.format(*m.groups()), transpose
    raise ValueError(f"checkpoint tensor {name!r} has no place in the model")


def param_path(path) -> str:
    """A tree path of the model's state as ``blocks/0/mixer/fa/q_proj/kernel``."""
    keys = [str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in path]
    return "/".join(keys[:-1] if keys and keys[-1] == "value" else keys)


def load_hf_checkpoint(folder: str | Path, *, dtype: str = "float32"):
    """(HybridLM with the checkpoint's weights, its ModelConfig, the HF config dict)."""
    folder = Path(folder)  # local path: safetensors memory-maps local files
    path = folder / "config.json"
    if not path.exists():
        raise FileNotFoundError(f"no config.json in {folder}")
    try:
        hf = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{e.lineno}:{e.colno}: not valid JSON ({e.msg})") from None
    if not isinstance(hf, dict):
        raise ValueError(f"{path}: not a JSON object")
    hf = _Keys(hf, str(path))
    cfg = config_from_hf(hf, dtype=dtype)
    abstract = nnx.eval_shape(lambda: HybridLM(cfg, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(abstract)
    want = {param_path(p): x for p, x in jax.tree_util.tree_flatten_with_path(state)[0]}
    got = {}
    for name, t in _tensors(folder):
        path, transpose = our_path(name)
        if path not in want:
            raise ValueError(
                f"checkpoint tensor {name!r} -> {path!r}: no such parameter "
                f"(tied embeddings: {cfg.tie_embeddings})"
            )
        t = t.T if transpose else t
        if t.shape != want[path].shape:
            raise ValueError(
                f"checkpoint tensor {name!r} has shape {t.shape}, parameter {path} "
                f"wants {want[path].shape}"
            )
        got[path] = jnp.asarray(t, want[path].dtype)
    missing = sorted(set(want) - set(got))
    if missing:
        raise ValueError(f"the checkpoint lacks {len(missing)} parameter(s), e.g. {missing[:3]}")
    state = jax.tree_util.tree_map_with_path(lambda p, _: got[param_path(p)], state)
    return nnx.merge(graphdef, state), cfg, hf
