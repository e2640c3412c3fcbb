"""Human-readable summaries of a ModelConfig: parameter counts and the per-layer allocation."""
from __future__ import annotations

from hwh_jax.models.config import ModelConfig
from hwh_jax.models.params import param_table
from hwh_jax.models.variants import ARCHS, SIZES, model_config


def allocation_string(cfg: ModelConfig) -> str:
    """e.g. 'FA 0,3,3,0 | LA 8,5,5,8' plus RoPE/window markers."""
    fa = ",".join(str(n) for n in cfg.fa_heads)
    la = ",".join(str(n) for n in cfg.la_heads)
    rope = {s.fa_rope for s in cfg.layers if s.num_fa}
    windows = sorted({s.window for s in cfg.layers if s.num_fa and s.window})
    pe = "RoPE" if rope == {True} else "NoPE" if rope == {False} else "RoPE+NoPE" if rope else "-"
    extra = f", window {windows[0]}" if windows else ""
    return f"FA {fa} | LA {la} (FA {pe}{extra})"


def describe(cfg: ModelConfig) -> str:
    p = param_table(cfg)
    lines = [
        f"arch {cfg.arch}: d={cfg.d_model} L={cfg.num_layers} H={cfg.num_heads} "
        f"D={cfg.head_dim} K={cfg.la_key_dim} V={cfg.la_value_dim} mlp={cfg.mlp_hidden} "
        f"vocab={cfg.vocab_size} dtype={cfg.dtype}",
        f"params: total {p['total']:,} (embedding {p['embedding']:,}, mixers {p['mixers']:,}, "
        f"MLPs {p['mlps']:,}, norms {p['norms']:,})",
        f"FA share {cfg.fa_share:.4f} ({sum(cfg.fa_heads)} FA / {sum(cfg.la_heads)} LA heads)",
        " layer  FA  LA  FA-pos  window",
    ]
    for l, s in enumerate(cfg.layers):
        pos = ("RoPE" if s.fa_rope else "NoPE") if s.num_fa else "-"
        lines.append(f" {l:5d} {s.num_fa:3d} {s.num_la:3d}  {pos:6s}  {s.window or '-'}")
    return "\n".join(lines)


def markdown_table(sizes=tuple(SIZES), archs=ARCHS) -> str:
    """The docs/models.md table: every architecture x size."""
    rows = ["| size | arch | params | vs transformer | mlp hidden | FA share | FA heads per layer |",
            "|---|---|---:|---:|---:|---:|---|"]
    for size in sizes:
        base = param_table(model_config("transformer", size))["total"]
        for arch in archs:
            cfg = model_config(arch, size)
            total = param_table(cfg)["total"]
            rows.append(f"| {size} | {arch} | {total / 1e6:.2f}M | {100 * (total / base - 1):+.2f}% "
                        f"| {cfg.mlp_hidden} | {cfg.fa_share:.3f} | "
                        f"{','.join(map(str, cfg.fa_heads))} |")
    return "\n".join(rows)
