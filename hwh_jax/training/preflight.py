"""Checks of a run's mesh against its batch and its model, made before anything compiles: each
problem one line naming the values and the key that fixes it.

- ``check_batch``: the global batch (and the accumulation's micro-batch) must split over the
  data-parallel devices, data x fsdp (every row on one device), and over the processes.
- ``unsplit_layers`` / ``check_heads``: with a tensor axis, each layer's heads are split over
  it. A layer whose head counts (full-attention query heads, their key/value heads, linear
  heads) the axis does not divide cannot be: its projections' columns split mid-head, so every
  tensor device runs the layer's kernels on all its heads and the activations' gradients are
  all-reduced over the axis. HwH's allocation gives most layers such counts (1, 3, 5, 11 of
  16). ``check_heads`` refuses such a mesh, naming the layers and the mesh that moves the
  tensor devices to fsdp instead; ``train.allow_unsplit_heads=True`` runs it anyway with a
  warning naming the layers. Why not round the allocation to the axis or split a layer's heads
  as one mixer: the first makes the model depend on the mesh (a checkpoint trained at tensor 2
  would not be the architecture of the paper), the second needs kernels that take both kinds
  in one launch; fsdp alone fits HwH-1.4B on 16 chips (docs/tpu.md).
"""

from __future__ import annotations

import logging

from hwh_jax.training.specs import RunSpecs

log = logging.getLogger(__name__)


def check_batch(
    batch_size: int, mesh_shape: dict, *, grad_accum: int = 0, processes: int = 1
) -> None:
    """Raises ValueError (one line, the fix) where ``batch_size`` rows cannot split over the
    mesh's data x fsdp devices or the processes."""
    dp = mesh_shape.get("data", 1) * mesh_shape.get("fsdp", 1)
    dims = ",".join(str(mesh_shape[a]) for a in mesh_shape)
    if batch_size % dp:
        raise ValueError(
            f"train.batch_size={batch_size} does not split over data x fsdp = {dp} devices "
            f"(train.mesh={dims}): every row lives on one device. Set train.batch_size to a "
            f"multiple of {dp}, or a train.mesh whose data x fsdp divides {batch_size} (the rest "
            f"on tensor, or fewer devices)"
        )
    if grad_accum and (batch_size // grad_accum) % dp:
        raise ValueError(
            f"train.grad_accum={grad_accum} leaves micro-batches of {batch_size // grad_accum} "
            f"rows, which do not split over data x fsdp = {dp} devices (train.mesh={dims}). "
            f"Set train.grad_accum to a divisor of {batch_size // dp}, or 0 (planned)"
        )
    if batch_size % processes:
        raise ValueError(
            f"train.batch_size={batch_size} does not split over the {processes} "
            f"processes: set it to a multiple of {processes}"
        )


def unsplit_layers(cfg, tensor: int) -> list[tuple[int, dict]]:
    """(layer, its head counts) for each layer of ``cfg`` whose head counts ``tensor`` does not
    divide (module docstring)."""
    if tensor <= 1:
        return []
    out = []
    for i, spec in enumerate(cfg.layers):
        counts = {"fa": spec.num_fa, "la": spec.num_la}
        if cfg.q_per_kv > 1:
            counts["kv"] = spec.num_fa // cfg.q_per_kv
        if any(n % tensor for n in counts.values() if n):
            out.append((i, {k: n for k, n in counts.items() if n}))
    return out


def _describe(layers: list[tuple[int, dict]]) -> str:
    shown = ", ".join(
        f"{i} (" + " ".join(f"{k} {n}" for k, n in c.items()) + ")" for i, c in layers[:8]
    )
    return shown + (f" and {len(layers) - 8} more" if len(layers) > 8 else "")


def check_heads(cfg, mesh_shape: dict, *, allow_unsplit: bool = False) -> list[int]:
    """Refuses (ValueError, one line) a tensor axis that some layers' head counts cannot split,
    or with ``allow_unsplit`` warns naming them; returns those layers."""
    tensor = mesh_shape.get("tensor", 1)
    layers = unsplit_layers(cfg, tensor)
    if not layers:
        return []
    data, fsdp = mesh_shape.get("data", 1), mesh_shape.get("fsdp", 1)
    what = (
        f"train.mesh puts {tensor} devices on tensor, which does not divide the head counts "
        f"of {len(layers)} of the {len(cfg.layers)} layers of {cfg.arch}: "
        f"{_describe(layers)}; those layers would run their kernels on every head on each "
        f"tensor device and all-reduce their activation gradients over it"
    )
    if not allow_unsplit:
        raise ValueError(
            f"{what}. Put those devices on fsdp instead "
            f"(train.mesh={data},{fsdp * tensor},1), or run it anyway with "
            f"train.allow_unsplit_heads=True"
        )
    log.warning("%s (train.allow_unsplit_heads=True)", what)
    return [i for i, _ in layers]


def check_sequence(seq_len: int, mesh_shape: dict) -> None:
    """A sequence axis splits every sequence into equal shards: it must divide seq_len."""
    n = mesh_shape.get("sequence", 1)
    if seq_len % n:
        dims = ",".join(str(mesh_shape[a]) for a in mesh_shape)
        fits = seq_len - seq_len % n
        raise ValueError(
            f"seq_len={seq_len} does not split over the sequence axis of {n} devices "
            f"(train.mesh={dims}): set seq_len to a multiple of {n} (e.g. {fits}) or change "
            f"the mesh's last size"
        )


TPU_TILE_ROWS = 16  # rows of a bf16 tile on a TPU core ((16, 128); fp32's is (8, 128))


def check_weight_shards(
    d_model: int, mesh_shape: dict, *, platform: str, allow_small: bool = False
) -> None:
    """On a TPU, refuses (ValueError, one line) an fsdp axis that leaves each weight shard fewer
    rows of d_model than a bf16 tile, naming the mesh that keeps a tile; with ``allow_small``
    it warns. Weights are split over fsdp along d_model (``sharding.RULES``: "embed"). Why:
    HwH-1.4B (d_model 2,048) on v6e-256 at fsdp 256, 8 rows a shard, was compiled with its
    gradients all-reduced whole instead of reduce-scattered: 5.2 GiB sent a chip a step
    (docs/tpu.md)."""
    fsdp = mesh_shape.get("fsdp", 1)
    if platform != "tpu" or fsdp <= 1 or d_model // fsdp >= TPU_TILE_ROWS:
        return
    data, tensor = mesh_shape.get("data", 1), mesh_shape.get("tensor", 1)
    seq = mesh_shape.get("sequence", 1)
    best = max(f for f in range(1, fsdp + 1) if fsdp % f == 0 and d_model // f >= TPU_TILE_ROWS)
    rest = ",".join(
        str(x) for x in (data * fsdp // best, best, tensor) + ((seq,) if seq > 1 else ())
    )
    what = (
        f"train.mesh puts {fsdp} devices on fsdp, which leaves each weight shard "
        f"{d_model // fsdp} rows of d_model {d_model}, fewer than a TPU bf16 tile's "
        f"{TPU_TILE_ROWS}: the compiler then all-reduces such gradients whole instead of "
        f"reduce-scattering them"
    )
    if not allow_small:
        raise ValueError(
            f"{what}. Move devices from fsdp to data (train.mesh={rest}), or run it anyway "
            f"with train.allow_small_shards=True"
        )
    log.warning("%s (train.allow_small_shards=True)", what)


def check_run(
    specs: RunSpecs, mesh_shape: dict, *, processes: int = 1, platform: str = ""
) -> list[int]:
    """Every check above for a run's specs on a mesh ({axis: size}) compiled for ``platform``
    (the weight shards are checked on "tpu" only); the model's head counts from its size and
    schedule (the vocabulary does not matter here)."""
    c = specs.train
    check_batch(c.batch_size, mesh_shape, grad_accum=c.grad_accum, processes=processes)
    check_sequence(c.seq_len, mesh_shape)
    cfg = specs.model_for(1)
    check_weight_shards(
        cfg.d_model, mesh_shape, platform=platform, allow_small=c.allow_small_shards
    )
    return check_heads(cfg, mesh_shape, allow_unsplit=c.allow_unsplit_heads)
