"""Model FLOPs per token, for MFU: the formula is written once, here, and in docs/training.md.

  training FLOPs / token = 6 * N_matmul                          (forward + backward, weights)
                         + sum_l 6 * n_fa(l) * D * T_eff(l)      (causal attention, fwd+bwd)
                         + sum_l 3 * n_la(l) * (4 C (K + V) + 6 K V)   (GDN chunked form)
                         (other linear-head kinds: n_la(l) times their HeadKind.flops;
                          the decaying-state chunked form's 3 * (2 C (K + V) + 4 K V):
                          intra-chunk scores and values, state read and write)
N_matmul = every weight in a matmul (all parameters minus the embedding table, plus the LM head
even when tied, minus norm/conv/A_log/dt_bias vectors, which are negligible and ignored);
T_eff = T for global causal attention (12 * D * T/2: QK^T and PV over on average T/2 keys, x3
for the backward), min(window, T) for a sliding window; the GDN term is the forward of the
chunked WY form per token and head (ANCHORS.md: 8CD + 6D^2 for K = V = D) times 3.
MFU = FLOPs/token * tokens/s / (peak FLOP/s of all devices).
"""

from __future__ import annotations

from hwh_jax.layers import heads
from hwh_jax.layers.config import ModelConfig
from hwh_jax.models.params import param_table

# Dense bf16 peak per device, FLOP/s (datasheets). Unknown kinds (CPU) report no MFU.
PEAK_FLOPS = {
    "NVIDIA H200": 989e12,
    "NVIDIA H100 80GB HBM3": 989e12,
    "NVIDIA H100": 989e12,
    "NVIDIA A100-SXM4-80GB": 312e12,
    "NVIDIA A100-SXM4-40GB": 312e12,
    "TPU v4": 275e12,
    "TPU v5 lite": 197e12,
    "TPU v5e": 197e12,
    "TPU v5p": 459e12,
    "TPU v5": 459e12,
    "TPU v6 lite": 918e12,
    "TPU v6e": 918e12,
}


def flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
    p = param_table(cfg)
    n_matmul = p["non_embedding"] + cfg.vocab_size * cfg.d_model - p["norms"]
    total = 6.0 * n_matmul
    per_linear_head = heads.get(cfg.la_kind).flops(cfg)
    for s in cfg.layers:
        t_eff = seq_len if s.window is None else min(s.window, seq_len)
        total += 6.0 * s.num_fa * cfg.head_dim * t_eff
        total += s.num_la * per_linear_head
    return total


def sequence_load(cfg: ModelConfig, seq_len: int, shards: int) -> dict:
    """The causal load of a sequence axis of ``shards`` devices. Each holding T / shards
    consecutive queries, shard i's see (i + 1/2) T / shards keys on average, so the last
    shard's global causal attention is (2 shards - 1) / shards times the mean (1.75x at 4,
    1.94x at 16); the devices run in lockstep, so it sets the step. With
    ``cfg.attention.balance`` (the default) and T a multiple of 2 shards, each device holds an
    early and a late chunk of T / 2 shards queries (``kernels_pallas.attention.zigzag``), whose
    pairs are exactly the mean: 1.0x. Windowed attention and the linear heads are balanced
    either way. Returns the global attention's share of the FLOPs, its factor on the busiest
    shard, that shard's compute over the mean and whether the queries are balanced."""
    if shards < 1:
        raise ValueError(f"shards must be >= 1, got {shards}")
    total = flops_per_token(cfg, seq_len)
    attention = sum(6.0 * s.num_fa * cfg.head_dim * seq_len for s in cfg.layers if s.window is None)
    share = attention / total
    balanced = shards > 1 and cfg.attention.balance and seq_len % (2 * shards) == 0
    factor = 1.0 if balanced else (2 * shards - 1) / shards
    return {
        "shards": shards,
        "balanced": balanced,
        "attention_share": share,
        "last_shard_attention": factor,
        "last_shard_compute": 1 + share * (factor - 1),
    }


def peak_flops(device_kind: str) -> float | None:
    for name, peak in PEAK_FLOPS.items():
        if device_kind.startswith(name):
            return peak
    return None
