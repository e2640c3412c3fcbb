"""The embedding lookup under a mesh: rows of a table sharded like every weight (its model
dimension over fsdp, its vocabulary over tensor where that divides it) for tokens whose rows
are split over the batch axes.

Left to GSPMD, the lookup's backward (a scatter-add of the rows' gradients into the table)
gathered every device's row gradients onto every device (the whole micro-batch's [B, T, d],
activation-sized, over data x fsdp) or all-reduced the whole fp32 table's gradient over all
chips, where every other weight's gradient is reduce-scattered over fsdp. ``lookup`` states
the exchange instead (a ``shard_map``):

  forward   the token ids of the fsdp group gathered (int32, a few KiB), each device's table
            slice [V, d/fsdp] looked up for all of them, the slices exchanged by an all-to-all
            so that each device holds its own rows whole: [b, T, d];
  backward  its transpose: the rows' gradients exchanged back by an all-to-all, scatter-added
            into the device's own table slice (no device holds the whole table or its
            gradient), then summed over data (and tensor) like any replicated weight's.

With the vocabulary over tensor each tensor device looks up the ids in its range and the rows
are summed over tensor (Megatron's vocabulary-parallel embedding). Without a mesh, with one
fsdp device, or where the batch or the model dimension does not split, it is ``jnp.take``.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from kernels_pallas.sharding import current


def lookup(table, tokens):
    """table [V, d], tokens [B, ...] int -> rows [B, ..., d] in the table's dtype."""
    km = current()
    if km is None:
        return jnp.take(table, tokens, axis=0)
    shape = km.mesh.shape
    fsdp, tensor = shape.get("fsdp", 1), shape.get("tensor", 1)
    batch = km.batch_spec(tokens.shape[0])
    batch_axes = (batch,) if isinstance(batch, str) else tuple(batch or ())
    V, d = table.shape
    if fsdp == 1 or "fsdp" not in batch_axes or d % fsdp:
        return jnp.take(table, tokens, axis=0)
    vocab = "tensor" if tensor > 1 and V % tensor == 0 else None
    lead = tokens.shape[1:]
    flat = tokens.reshape(tokens.shape[0], math.prod(lead))

    def per_device(t, ids):  # t [V / tensor, d / fsdp], ids [b, L]
        ids = jax.lax.all_gather(ids, "fsdp", axis=0, tiled=True)  # [fsdp * b, L]
        if vocab:
            local = ids - jax.lax.axis_index("tensor") * t.shape[0]
            inside = (local >= 0) & (local < t.shape[0])
            rows = jnp.take(t, jnp.where(inside, local, 0), axis=0)
            rows = jax.lax.psum(jnp.where(inside[..., None], rows, 0), "tensor")
        else:
            rows = jnp.take(t, ids, axis=0)  # [fsdp b, L, d/f]
        return jax.lax.all_to_all(rows, "fsdp", 0, 2, tiled=True)  # [b, L, d]

    rows = jax.shard_map(
        per_device,
        mesh=km.mesh,
        in_specs=(P(vocab, "fsdp"), P(batch, None)),
        out_specs=P(batch, None, None),
    )(table, flat)
    return rows.reshape(*tokens.shape, d)
