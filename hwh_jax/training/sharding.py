"""Device mesh and the one table that maps logical axis names onto it.

Weights carry logical names (``nnx.with_partitioning``); ``RULES`` says which mesh axis each
name is split over. The mesh has axes (data, fsdp, tensor, sequence): batch over data x fsdp,
weights over fsdp (ZeRO-3 style: gathered per layer by XLA) and tensor (Megatron-style heads /
MLP), and the activations' time dimension over sequence (``kernels_pallas.sharding.constrain``;
the recurrences pass their states between time shards: ``kernels_pallas/gdn/sequence.py``).
A weight dimension that a mesh axis does not divide stays replicated along that axis.
"""

from __future__ import annotations

import logging
import math

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

log = logging.getLogger(__name__)

MESH_AXES = ("data", "fsdp", "tensor", "sequence")

RULES = (
    ("batch", ("data", "fsdp")),
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("mlp", "tensor"),
    ("norm", None),
    ("conv", None),
)


def mesh_shape(dims, num_devices: int) -> tuple[int, int, int, int]:
    """Resolve (data, fsdp, tensor[, sequence]) with at most one -1 (= the rest of the devices);
    three sizes leave the sequence axis at 1."""
    dims = [int(d) for d in dims]
    if len(dims) not in (3, 4):
        raise ValueError(f"mesh needs 3 or 4 sizes (data, fsdp, tensor[, sequence]), got {dims}")
    dims = dims + [1] * (4 - len(dims))
    if dims.count(-1) > 1 or any(d == 0 or d < -1 for d in dims):
        raise ValueError(f"mesh sizes must be positive with at most one -1, got {dims}")
    known = math.prod(d for d in dims if d != -1)
    if num_devices % known:
        raise ValueError(f"mesh {tuple(dims)} does not divide the {num_devices} devices")
    dims = [num_devices // known if d == -1 else d for d in dims]
    if math.prod(dims) != num_devices:
        log.warning("mesh %s uses %d of the %d devices", tuple(dims), math.prod(dims), num_devices)
    return tuple(dims)


def make_mesh(dims, devices=None) -> Mesh:
    devices = jax.devices() if devices is None else devices
    shape = mesh_shape(dims, len(devices))
    devices = devices[: math.prod(shape)]
    try:
        from jax.experimental import mesh_utils

        grid = mesh_utils.create_device_mesh(shape, devices=devices)
    except Exception:  # noqa: BLE001 - an unusual topology: plain order is correct, maybe slower
        grid = np.asarray(devices).reshape(shape)
    return Mesh(grid, MESH_AXES)


def logical_to_mesh(names, shape=None, mesh: Mesh | None = None) -> P:
    """PartitionSpec for logical ``names``; drops an axis that does not divide its dimension."""
    table = dict(RULES)
    out = []
    used = set()
    for i, name in enumerate(names or ()):
        axis = table.get(name) if name is not None else None
        if name is not None and name not in table:
            raise KeyError(f"logical axis {name!r} has no rule in hwh_jax.training.sharding.RULES")
        axes = (axis,) if isinstance(axis, str) else tuple(axis or ())
        axes = tuple(a for a in axes if a not in used)
        if mesh is not None and shape is not None and axes:
            size = math.prod(mesh.shape[a] for a in axes)
            if shape[i] % size:
                axes = ()
        used.update(axes)
        out.append(axes[0] if len(axes) == 1 else (axes or None))
    return P(*out)


def state_shardings(abstract_state, mesh: Mesh):
    """NamedSharding tree (same structure as the NNX state) from the weights' logical names."""
    from flax import nnx

    specs = nnx.get_partition_spec(abstract_state)
    return jax.tree.map(
        lambda x, spec: NamedSharding(mesh, logical_to_mesh(tuple(spec), x.shape, mesh)),
        abstract_state,
        specs,
        is_leaf=lambda x: isinstance(x, P),
    )


def batch_sharding(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, logical_to_mesh(("batch",)))


def data_parallel_size(mesh: Mesh) -> int:
    return mesh.shape["data"] * mesh.shape["fsdp"]
