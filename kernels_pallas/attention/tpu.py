"""Attention on TPU through JAX's splash attention kernel (Pallas/Mosaic).

Splash takes one sequence and [heads, T, D]; we vmap over batch and over kv groups (each group
is an MQA problem: its H/G query heads share one k/v), and fold the scale into q.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

from kernels_pallas.attention import zigzag

BLOCK = 128  # splash tiles the sequence in blocks of this many tokens


class _Band:
    """A splash mask whose row q allows the keys [q - left, q + right] (None: unbounded), with
    its blocks wholly inside or wholly outside the band given as a 1 x 1 array. Splash turns
    a mask into block tables on the host, asking each block only whether any and whether all
    of it is allowed; evaluated whole, every block of T^2 tokens, that took 13 s at 64K tokens
    and grew quadratically (about an hour at 1M). Partial blocks are evaluated as before.
    Row r is the query at ``q_sequence[r]`` (splash's own field: r, or the balanced order of
    ``zigzag.positions``); a block whose rows are not consecutive positions is evaluated."""

    def __getitem__(self, idx):
        if len(idx) != 2 or not all(isinstance(i, slice) for i in idx):
            return super().__getitem__(idx)
        r0, r1, _ = idx[0].indices(self.shape[0])
        k0, k1, _ = idx[1].indices(self.shape[1])
        if r1 <= r0 or k1 <= k0:
            return super().__getitem__(idx)
        q0, q1 = int(self.q_sequence[r0]), int(self.q_sequence[r1 - 1]) + 1
        if q1 - q0 != r1 - r0:
            return super().__getitem__(idx)
        left, right = self.band
        lo = lambda q: -np.inf if left is None else q - left
        hi = lambda q: np.inf if right is None else q + right
        if lo(q1 - 1) <= k0 and hi(q0) >= k1 - 1:  # every row allows every key of the block
            return np.ones((1, 1), np.bool_)
        if hi(q1 - 1) < k0 or lo(q0) > k1 - 1:  # the band moves a key a row: none can
            return np.zeros((1, 1), np.bool_)
        return super().__getitem__(idx)


class _CausalBand(_Band, sm.CausalMask):
    band = (None, 0)


class _LocalBand(_Band, sm.LocalMask):
    @property
    def band(self):
        return self.window_size


def supported(T: int, D: int, q_shards: int = 1) -> bool:
    """Whether splash takes T tokens of head size D, its queries split in ``q_shards``."""
    return T % q_shards == 0 and (T // q_shards) % BLOCK == 0 and D % 64 == 0


@functools.lru_cache(maxsize=32)
def _kernel(T, heads, causal, window, interpret, q_shards=1, balance=False):
    """The splash kernel for these static settings, cached. Built at compile-time evaluation: it
    holds its mask tables as arrays, and built first under a trace (a ``shard_map`` of
    ``kernel_mesh``) they were that trace's tracers, leaked into every later call.

    ``q_shards`` > 1: the kernel of a sequence axis of that many devices, each holding T /
    q_shards queries and all T keys; its mask tables are the whole sequence's, laid out so that
    each device takes its rows of them (``attention/op.py``'s ``_over_time_shards``);
    ``balance`` (causal, no window): the rows in ``zigzag.positions`` order, each device's two
    chunks of T / 2 q_shards queries, in blocks that do not straddle a chunk."""
    with jax.ensure_compile_time_eval():
        return _build(T, heads, causal, window, interpret, q_shards, balance)


def _build(T, heads, causal, window, interpret, q_shards=1, balance=False):
    if window is not None:
        one = _LocalBand((T, T), window_size=(window - 1, 0 if causal else None), offset=0)
    elif causal:
        one = _CausalBand((T, T))
        if balance:  # splash's own field: the position of each row, read in and out of kernel
            one.q_sequence = zigzag.positions(T, q_shards)
    else:
        one = sm.FullMask((T, T))
    mask = sm.MultiHeadMask([one] * heads)
    block = min(512, T // q_shards // (2 if balance else 1))
    sizes = sk.BlockSizes(
        block_q=block,
        block_kv=block,
        block_kv_compute=block,
        block_q_dkv=block,
        block_kv_dkv=block,
        block_kv_dkv_compute=block,
        block_q_dq=block,
        block_kv_dq=block,
    )
    return sk.make_splash_mqa(
        mask, block_sizes=sizes, head_shards=1, q_seq_shards=q_shards, interpret=interpret
    )


def splash_attention(
    q, k, v, *, causal=True, window=None, scale=None, segment_ids=None, interpret=False
):
    """q [B,T,H,D], k/v [B,T,G,D] -> [B,T,H,D]; segment_ids [B, T]: attend within a segment
    (splash's own ``SegmentIds``, which skips no block but masks per token)."""
    B, T, H, D = q.shape
    kernel = _kernel(T, H // k.shape[2], causal, window, interpret)
    return run(kernel, q, k, v, scale, segment_ids, segment_ids)


def sharded_kernel(T, heads, causal, window, interpret, q_shards, balance=False):
    """The kernel of a sequence axis of ``q_shards`` devices (see ``_kernel``): pass it into the
    ``shard_map`` with ``kernel.manual_sharding_spec`` over (heads, the sequence axis)."""
    return _kernel(T, heads, causal, window, interpret, q_shards, balance)


def run(kernel, q, k, v, scale, q_segment_ids, kv_segment_ids):
    """q [B,Tq,H,D], k/v [B,T,G,D] through ``kernel`` -> [B,Tq,H,D]."""
    B, Tq, H, D = q.shape
    G = k.shape[2]
    scale = D**-0.5 if scale is None else scale
    qg = jnp.transpose((q * scale).astype(q.dtype).reshape(B, Tq, G, H // G, D), (0, 2, 3, 1, 4))
    kg = jnp.transpose(k, (0, 2, 1, 3))  # [B, G, T, D]
    vg = jnp.transpose(v, (0, 2, 1, 3))
    if q_segment_ids is None:
        o = jax.vmap(jax.vmap(kernel))(qg, kg, vg)  # [B, G, H/G, Tq, D]
    else:

        def row(q, k, v, q_seg, kv_seg):  # one row's G groups
            ids = sk.SegmentIds(q=q_seg, kv=kv_seg)
            return jax.vmap(lambda q, k, v: kernel(q, k, v, segment_ids=ids))(q, k, v)

        seg = (q_segment_ids.astype(jnp.int32), kv_segment_ids.astype(jnp.int32))
        o = jax.vmap(row)(qg, kg, vg, *seg)
    return jnp.transpose(o, (0, 3, 1, 2, 4)).reshape(B, Tq, H, D)
