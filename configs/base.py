"""Shared defaults of every run config. ``get_config("hwh_tiny")`` or ``"arch=hwh,size=tiny"``.

Only launchers and the trainer read this ConfigDict; the model gets a frozen ModelConfig built
by ``hwh_jax.models.variants.model_config_from_dict(config.model)``.
"""
from __future__ import annotations

import ml_collections

from hwh_jax.models.variants import ARCHS, SIZES


def parse_arg(arg: str | None) -> tuple[str, str]:
    """'hwh_tiny' or 'arch=hwh,size=tiny' -> ('hwh', 'tiny')."""
    if not arg:
        return "hwh", "tiny"
    if "=" in arg:
        kv = dict(part.split("=", 1) for part in arg.split(","))
        return kv.get("arch", "hwh"), kv.get("size", "tiny")
    arch, _, size = arg.rpartition("_")
    if arch not in ARCHS or size not in SIZES:
        raise ValueError(f"config variant {arg!r} is not <arch>_<size> with arch in {ARCHS} "
                         f"and size in {list(SIZES)}")
    return arch, size


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    arch, size = parse_arg(arg)
    config = ml_collections.ConfigDict()
    config.seed = 0                        # init and data-order seed
    config.seq_len = 2048 if size != "tiny" else 256  # training context length
    m = config.model = ml_collections.ConfigDict()
    m.arch = arch                          # one of hwh_jax.models.ARCHS
    m.size = size                          # row of hwh_jax.models.SIZES
    m.fa_share = 0.1875                    # hwh*: FA heads / all heads (< 0.25)
    m.counts = ""                          # hwh*: per-layer FA counts "0,2,3,0" or a JSON path
    m.ratio = (1, 3)                       # layerwise/swa: FA layers : other layers
    m.window = 0                           # swa: local window (0 = the size's default)
    m.vocab_size = 0                       # 0 = the size's default (tokenizer must fit in it)
    m.q_per_kv = 1                         # GQA group size of FA heads
    m.qk_norm = False                      # Qwen3-style q/k RMSNorm in FA heads
    m.rope_theta = 10000.0
    m.rope_pairing = "half"                # "half" (HF) or "interleaved"
    m.dtype = "bfloat16"                   # compute dtype (params stay float32)
    m.attn_impl = "auto"                   # kernels_pallas.attention impl
    m.gdn_impl = "auto"                    # kernels_pallas.gated_delta_rule impl
    m.gdn_chunk_size = 64
    config.lock()
    return config
