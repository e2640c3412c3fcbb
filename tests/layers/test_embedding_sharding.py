"""The embedding lookup under a mesh (``layers.embedding``): rows and the table's gradient equal
``jnp.take``'s on one device, for the meshes a run uses (fsdp with data, the vocabulary over
tensor, a batch that fsdp does not split), and the compiled step exchanges rows, not the
table: no collective carries the whole table's gradient or the whole micro-batch's rows."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from hwh_jax.layers.embedding import lookup
from hwh_jax.profiling import hlo
from hwh_jax.training import sharding as shd
from kernels_pallas.sharding import kernel_mesh

pytestmark = pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (fake) devices")
V, D, B, T = 96, 32, 8, 5


def loss(table, tokens, w):
    return jnp.sum(jnp.sin(lookup(table, tokens)) * w)


@pytest.mark.parametrize("dims", [(2, 4, 1), (1, 8, 1), (1, 4, 2), (1, 2, 4), (8, 1, 1), (2, 2, 2)])
def test_rows_and_table_gradient_equal_the_unsharded_lookup(dims):
    rng = np.random.default_rng(0)
    table = jnp.asarray(rng.normal(size=(V, D)), jnp.float32)
    tokens = jnp.asarray(rng.integers(0, V, size=(B, T)), jnp.int32)
    tokens = tokens.at[0, :3].set(7)  # a token repeated: its gradient rows add up
    w = jnp.asarray(rng.normal(size=(B, T, D)), jnp.float32)
    want_rows, want_grad = jnp.take(table, tokens, axis=0), jax.grad(loss)(table, tokens, w)
    mesh = shd.make_mesh(dims)
    table_sh = NamedSharding(mesh, shd.logical_to_mesh(("vocab", "embed"), table.shape, mesh))
    rows_sh = NamedSharding(mesh, P(("data", "fsdp")))

    @jax.jit
    def run(table, tokens, w):
        with kernel_mesh(mesh):
            return lookup(table, tokens), jax.grad(loss)(table, tokens, w)

    rows, grad = run(
        jax.device_put(table, table_sh), jax.device_put(tokens, rows_sh), jax.device_put(w, rows_sh)
    )
    np.testing.assert_array_equal(np.asarray(rows), np.asarray(want_rows))
    np.testing.assert_allclose(np.asarray(grad), np.asarray(want_grad), rtol=1e-6, atol=1e-6)


def test_the_backward_exchanges_rows_not_the_table():
    """fsdp 4 x data 2: the table's gradient is never all-reduced whole, and no collective
    holds the whole batch's rows (what GSPMD did without the explicit exchange)."""
    Vb, Db, Bb, Tb = 4096, 256, 16, 64
    mesh = shd.make_mesh((2, 4, 1))
    table_sh = NamedSharding(mesh, shd.logical_to_mesh(("vocab", "embed"), (Vb, Db), mesh))
    rows_sh = NamedSharding(mesh, P(("data", "fsdp")))

    def step(table, tokens, w):
        with kernel_mesh(mesh):
            return jax.grad(loss)(table, tokens, w)

    args = (
        jax.ShapeDtypeStruct((Vb, Db), jnp.float32, sharding=table_sh),
        jax.ShapeDtypeStruct((Bb, Tb), jnp.int32, sharding=rows_sh),
        jax.ShapeDtypeStruct((Bb, Tb, Db), jnp.float32, sharding=rows_sh),
    )
    found = hlo.collectives(jax.jit(step, out_shardings=table_sh).lower(*args).compile().as_text())
    table_bytes = Vb * Db * 4
    assert all(c.bytes < table_bytes for c in found), found
    # only the token ids are gathered (int32), the rows travel by all-to-all: each device's
    # rows, d / fsdp of them to each peer, never the batch's rows onto every device
    assert all(c.bytes <= Bb * Tb * 4 for c in found if c.op == "all-gather"), found
    assert {c.op for c in found} <= {"all-gather", "all-to-all", "all-reduce"}, found
    assert all(c.bytes <= Bb * Tb * Db * 4 // 2 for c in found if c.op == "all-to-all"), found
    # the table's gradient: its own fsdp slice summed over the two data replicas
    assert any(
        c.op == "all-reduce" and c.bytes == table_bytes // 4 and c.group == 2 for c in found
    ), found
