"""Running a Pallas kernel per device under a mesh.

GSPMD cannot partition a ``pallas_call``: under a multi-device ``jit`` it would gather the
operands and run the whole batch on every device. The trainer therefore traces its steps inside
``kernel_mesh(mesh)``, and the kernel entry points that see a mesh there wrap their kernel in a
``shard_map``: batch rows over the batch axes (data, fsdp) and heads over the tensor axis, each
device running the kernel on its own rows and heads (the ops are independent per row and
head). A ``sequence`` axis in the mesh
splits the time dimension: the linear recurrences (the gated delta rule, the decays, HGRN's
gates) run per time shard and pass their states between them (``time_shards.py``); attention
keeps each device's queries and gathers the keys and values (``attention/op.py``); the short
convolutions are left to GSPMD, which passes each shard its halo.
An axis that does not divide its dimension is left unsharded (that dimension is then
computed whole on each device of that axis: correct, only redundant).

``kernel_mesh`` is a context manager and a decorator; the context is read at trace time.

``constrain(x)`` pins an activation to that layout (rows over the batch axes, optionally its last
dimension over the tensor axis) for GSPMD. Without such pins GSPMD partitions an FSDP step's
matmuls along the weights' sharded dimension and moves whole-batch activations instead of
weights, several times the bytes (``bench/collectives.py`` counts them; docs/training.md).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import math

import jax
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P


@dataclasses.dataclass(frozen=True)
class KernelMesh:
    """The mesh the kernels run on per shard, with the axes a batch dimension is split over and
    the axis heads are split over; ``*_spec`` give the axis for a dimension, None where it does
    not divide."""

    mesh: Mesh
    batch_axes: tuple[str, ...] = ("data", "fsdp")
    head_axis: str | None = "tensor"
    seq_axis: str | None = "sequence"  # the time dimension's axis (absent from the mesh: none)

    def batch_spec(self, batch: int):
        """Mesh axes for a batch dimension of size ``batch`` (None: not sharded)."""
        axes = tuple(a for a in self.batch_axes if self.mesh.shape.get(a, 1) > 1)
        if not axes or batch % math.prod(self.mesh.shape[a] for a in axes):
            return None
        return axes[0] if len(axes) == 1 else axes

    def head_spec(self, heads: int):
        n = self.mesh.shape.get(self.head_axis, 1) if self.head_axis else 1
        return self.head_axis if n > 1 and heads % n == 0 else None

    def seq_spec(self, length: int):
        """The mesh axis a time dimension of ``length`` is split over (None: not split)."""
        n = self.mesh.shape.get(self.seq_axis, 1) if self.seq_axis else 1
        return self.seq_axis if n > 1 and length % n == 0 else None


_CURRENT: contextvars.ContextVar[KernelMesh | None] = contextvars.ContextVar(
    "kernels_pallas_mesh", default=None
)


@contextlib.contextmanager
def kernel_mesh(
    mesh: Mesh | None, batch_axes=("data", "fsdp"), head_axis="tensor", seq_axis="sequence"
):
    """Kernels traced inside run per shard of ``mesh`` (None or one device: no change)."""
    km = (
        None
        if mesh is None or mesh.size == 1
        else KernelMesh(mesh, tuple(batch_axes), head_axis, seq_axis)
    )
    token = _CURRENT.set(km)
    try:
        yield km
    finally:
        _CURRENT.reset(token)


def current() -> KernelMesh | None:
    return _CURRENT.get()


def constrain(x, heads: int | None = None):
    """x [B, ..., X] with its rows over the batch axes of the current ``kernel_mesh``, the time
    dimension of x [B, T, ..., X] over the sequence axis when the mesh has one that divides T,
    and, given ``heads`` (X = heads * per-head size), its last dimension over the tensor axis
    when that divides ``heads``; replicated otherwise. No mesh (or one device): x unchanged."""
    km = current()
    if km is None:
        return x
    last = km.head_spec(heads) if heads else None
    middle = [None] * (x.ndim - 2)
    if middle:
        middle[0] = km.seq_spec(x.shape[1])
    spec = P(km.batch_spec(x.shape[0]), *middle, last)
    return jax.lax.with_sharding_constraint(x, jax.sharding.NamedSharding(km.mesh, spec))


def per_shard(fn, km: KernelMesh, in_specs, out_specs):
    """``fn`` under ``shard_map`` over ``km.mesh`` (specs are PartitionSpecs or None leaves)."""
    return jax.shard_map(fn, mesh=km.mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)


__all__ = ["KernelMesh", "P", "constrain", "current", "kernel_mesh", "per_shard"]
