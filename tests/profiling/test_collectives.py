"""``profiling.hlo.collectives`` on programs compiled by the TPU compiler (compile-only devices
of a v5e 2x2 slice, ``libtpu``): every collective of a small program with known collectives
found once, with its kind, replica group size, bytes and loop count; the asynchronous
start/continuation/done fusions of a compiled FSDP step counted once per channel."""

import functools
import os

import numpy as np
import pytest

pytest.importorskip("libtpu")
os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

import jax  # after the libtpu environment above
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from hwh_jax.profiling import hlo
from hwh_jax.training import tpu_slices


@pytest.fixture(scope="module")
def mesh():
    devices = tpu_slices.compile_only_devices(tpu_slices.parse("v5e:2x2"))
    return Mesh(np.array(devices).reshape(2, 2), ("a", "b"))


def test_each_collective_of_a_known_program_once(mesh):
    @functools.partial(
        jax.shard_map,
        mesh=mesh,
        in_specs=P("a", "b"),
        check_vma=False,
        out_specs=(P("a", "b"), P("a", None), P(("a", "b"), None), P("a", "b")),
    )
    def f(x):  # x: [256, 512] f32 a device
        y = jax.lax.psum(x * 2.0, "a")  # all-reduce over 2
        y = jax.lax.psum(jnp.cos(y) * x, "a")  # a second one, same shape
        z = jax.lax.all_gather(x + 1.0, "b", axis=1, tiled=True)  # [256, 1024] over 2
        w = jax.lax.psum_scatter(x * 3.0, ("a", "b"), scatter_dimension=0, tiled=True)
        v = jax.lax.fori_loop(
            0, 3, lambda i, c: jax.lax.ppermute(jnp.sin(c), "b", [(0, 1), (1, 0)]), x
        )  # a permute, 3 times
        return y, z, w, v

    x = jax.ShapeDtypeStruct((512, 1024), jnp.float32, sharding=NamedSharding(mesh, P("a", "b")))
    found = hlo.collectives(jax.jit(f).lower(x).compile().as_text())
    got = sorted((c.op, c.shapes, c.bytes, c.group, c.times) for c in found)
    block = 256 * 512 * 4
    assert got == [
        ("all-gather", ((256, 1024),), 2 * block, 2, 1),
        ("all-reduce", ((256, 512),), block, 2, 1),
        ("all-reduce", ((256, 512),), block, 2, 1),
        ("collective-permute", ((256, 512),), block, 0, 3),
        ("reduce-scatter", ((64, 512),), block // 4, 4, 1),
    ]
    s = hlo.summary(found)
    assert s["collective-permute"] == {"count": 3, "bytes": 3 * block, "wire_bytes": 3 * block}
    assert s["all-reduce"]["wire_bytes"] == 2 * block  # 2 x 2 (g-1)/g of the block
    assert s["reduce-scatter"]["wire_bytes"] == 3 * block // 4  # 3 shards sent


def test_a_compiled_fsdp_step_counts_each_async_collective_once(mesh):
    """An FSDP matmul chain with accumulation: the TPU compiler writes the weights' gathers as
    asynchronous fusions (start, continuations overlapped with the matmul, done: each holding
    the all-gather) and the gradient's reduce-scatter as an all-reduce fused with its slice.
    Each weight is gathered once a micro-batch, its gradient reduce-scattered once a
    micro-batch."""
    layers, d, rows, micro = 4, 512, 512, 3
    fsdp = NamedSharding(mesh, P(None, ("a", "b")))

    def loss(ws, x):
        for w in ws:
            x = jnp.tanh(x @ w)
        return jnp.mean(x**2)

    def step(ws, xs):
        def body(g, x):
            return jax.tree.map(jnp.add, g, jax.grad(loss)(ws, x)), None

        g, _ = jax.lax.scan(body, jax.tree.map(jnp.zeros_like, ws), xs)
        return jax.tree.map(lambda w, gw: w - 0.1 * gw, ws, g)

    ws = [jax.ShapeDtypeStruct((d, d), jnp.float32, sharding=fsdp) for _ in range(layers)]
    xs = jax.ShapeDtypeStruct(
        (micro, rows, d), jnp.float32, sharding=NamedSharding(mesh, P(None, ("a", "b")))
    )
    text = jax.jit(step, out_shardings=[fsdp] * layers).lower(ws, xs).compile().as_text()
    raw = text.count(" all-gather(")
    found = hlo.collectives(text)
    gathers = [c for c in found if c.op == "all-gather" and c.shapes == ((d, d),)]
    per_step = sum(c.times for c in gathers)
    assert all(c.group == 4 for c in gathers)
    # forward, and again for the backward unless XLA keeps the gathered weight: once or twice
    # a layer and micro-batch, never once per fusion that holds a piece of the gather
    assert per_step in (layers * micro, 2 * layers * micro), (per_step, raw)
    assert all(c.times == micro for c in gathers)
    # each layer's gradient reduce-scattered (the TPU's all-reduce fused with its slice,
    # several layers combined into one) once a micro-batch
    scattered = [c for c in found if c.op == "reduce-scatter"]
    assert sum(len(c.shapes) * c.times for c in scattered) == layers * micro, found
    assert not [c for c in found if c.op == "all-reduce" and c.bytes >= d * d]
