"""Causal attention over a sequence axis with every device doing the same work.

Device j of n on a sequence axis holds the queries [jL, (j+1)L). Under a causal mask query t
sees t + 1 keys, so the last device attends (2n - 1) / n times the mean number of (query, key)
pairs (1.75x at 4 devices, 1.94x at 16) and, the devices running in lockstep, sets the step.
Cut the sequence in 2n chunks of h = L / 2: device j holds chunks 2j and 2j + 1. Swapping the
second half with device n - 1 - j (one ``ppermute`` of [B, h, H, D], its own inverse) leaves
device j the chunks

    a = 2j  and  b = 2n - 1 - 2j,

an early and a late one, whose pairs add up to the same (2n h^2) on every device (the
load-balanced assignment of context parallelism in MaxText and Megatron, reached with a
single swap). The recurrences keep their tokens in order: only the attention's queries move,
and their outputs move back. ``positions`` gives the global positions of a device's rows after
the swap, the splash kernel's row order (``tpu.py``).

``zigzag_rows`` is the cuDNN form (and its XLA stand-in for the CPU): the 2n - 1 key chunks
before a or b, one call of blocks of h stacked on the batch axis (chunk m < a serves a, the
rest serve b; the count 2n - 1 is the same on every device, so the shapes are static), and the
two diagonal blocks, one causal call; merged per query chunk by log-sum-exp, each block's
backward run with the merged output and lse (``shard_rows``' rule). Per device it attends
2n h^2 = nL^2 / 2 pairs where ``shard_rows`` runs the last device's (n - 1/2) L^2: 0.53x at 8.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from kernels_pallas.attention.reference import same_segment
from kernels_pallas.attention.shard_rows import CUDNN, Blocks, _put, _take


def chunks(index, n):
    """The two chunks of h = L / 2 tokens device ``index`` of ``n`` holds after the swap (its
    own first, then its partner's second): (2 index, 2n - 1 - 2 index)."""
    return 2 * index, 2 * n - 1 - 2 * index


def swap(x, axis: str, n: int):
    """Inside a ``shard_map``: x [B, L, ...] -> the first half kept, the second half that of
    device n - 1 - j (which gets this device's). Its own inverse: applied to the outputs it
    returns each device's rows to their owner."""
    h = x.shape[1] // 2
    other = jax.lax.ppermute(x[:, h:], axis, [(j, n - 1 - j) for j in range(n)])
    return jnp.concatenate([x[:, :h], other], axis=1)


def positions(T: int, n: int) -> np.ndarray:
    """[T] the global positions of the rows, device after device, once each has swapped."""
    h = T // (2 * n)
    return np.concatenate(
        [np.arange(c * h, (c + 1) * h) for j in range(n) for c in chunks(j, n)]
    ).astype(np.int32)


def _chunk(x, c, h):
    return jax.lax.dynamic_slice_in_dim(x, c * h, h, axis=1)


def rows(x, index, n: int):
    """x [B, T, ...] of the whole sequence (gathered) -> device ``index``'s rows after the
    swap, [B, T / n, ...]: its chunks a then b (``chunks``; index may be traced)."""
    h = x.shape[1] // (2 * n)
    return jnp.concatenate([_chunk(x, c, h) for c in chunks(index, n)], axis=1)


def _layout(index, n, h):
    """The off-diagonal blocks: for m = 0..2n-2, whether it serves chunk b (``serves_b`` [M])
    and its key positions [M, h] (chunk m for a, chunk m - a for b)."""
    a, _ = chunks(index, n)
    m = jnp.arange(2 * n - 1)
    serves_b = m >= a
    key_chunk = jnp.where(serves_b, m - a, m)
    return serves_b, key_chunk[:, None] * h + jnp.arange(h)


def _pick(serves_b, xa, xb):
    """[M, ...]: xb where the block serves b, else xa (xa, xb of one shape)."""
    sel = serves_b.reshape((-1,) + (1,) * xa.ndim)
    return jnp.where(sel, xb[None], xa[None])


def _stacked(x):
    """[M, B, ...] -> [M B, ...] (block-major, as ``_take``)."""
    return x.reshape(-1, *x.shape[2:])


def _calls(q, k, v, q_seg, kv_seg, index, n):
    """The two calls' inputs: (diagonal q, k, v, mask), (off-diagonal q, k, v, mask), and the
    layout."""
    B, L = q.shape[:2]
    h = L // 2
    a, b = chunks(index, n)
    qa, qb = q[:, :h], q[:, h:]
    diag_k = jnp.concatenate([_chunk(k, a, h), _chunk(k, b, h)])
    diag_v = jnp.concatenate([_chunk(v, a, h), _chunk(v, b, h)])
    serves_b, keys = _layout(index, n, h)
    off_q = _stacked(_pick(serves_b, qa, qb))
    diag_mask = off_mask = None
    if q_seg is not None:
        sa, sb = q_seg[:, :h], q_seg[:, h:]
        diag_kv_seg = jnp.concatenate([_chunk(kv_seg, a, h), _chunk(kv_seg, b, h)])
        diag_mask = same_segment(jnp.concatenate([sa, sb]), diag_kv_seg)
        off_mask = same_segment(_stacked(_pick(serves_b, sa, sb)), _take(kv_seg, keys))
    diagonal = (jnp.concatenate([qa, qb]), diag_k, diag_v, diag_mask)
    off = (off_q, _take(k, keys), _take(v, keys), off_mask)
    return diagonal, off, serves_b, keys


def _forward(blocks, scale, q, k, v, q_seg, kv_seg, index, n):
    B, L, H, _ = q.shape
    h = L // 2
    diagonal, off, serves_b, _ = _calls(q, k, v, q_seg, kv_seg, index, n)
    od, lsed = blocks.forward(*diagonal, True, None, scale)  # [2B, h, H, D], [2B, H, h]
    oo, lseo = blocks.forward(*off, False, None, scale)  # [M B, h, H, D], [M B, H, h]
    M = serves_b.shape[0]
    oo, lseo = oo.reshape(M, B, h, H, -1), lseo.reshape(M, B, H, h)
    outs, lses = [], []
    for x, mine in ((0, ~serves_b), (1, serves_b)):
        parts = jnp.concatenate(
            [lsed[x * B : (x + 1) * B][None], jnp.where(mine[:, None, None, None], lseo, -jnp.inf)]
        )  # [1 + M, B, H, h]
        lse = jax.nn.logsumexp(parts, axis=0)
        w = jnp.exp(parts - lse).transpose(0, 1, 3, 2)[..., None]  # [1 + M, B, h, H, 1]
        o = jnp.concatenate([od[x * B : (x + 1) * B][None], oo]).astype(jnp.float32)
        outs.append(jnp.sum(o * w, axis=0))
        lses.append(lse)
    return jnp.concatenate(outs, 1).astype(q.dtype), jnp.concatenate(lses, -1)


def _backward(blocks, scale, q, k, v, q_seg, kv_seg, index, n, o, lse, do):
    B, L = q.shape[:2]
    h = L // 2
    a, b = chunks(index, n)
    diagonal, off, serves_b, keys = _calls(q, k, v, q_seg, kv_seg, index, n)
    M = serves_b.shape[0]
    halves = lambda x, axis=1: (
        jax.lax.slice_in_dim(x, 0, h, axis=axis),
        jax.lax.slice_in_dim(x, h, L, axis=axis),
    )
    (oa, ob), (lsea, lseb), (doa, dob) = halves(o), halves(lse, -1), halves(do)
    g = blocks.backward(
        *off,
        False,
        None,
        scale,
        _stacked(_pick(serves_b, oa, ob)),
        _stacked(_pick(serves_b, lsea, lseb)),
        _stacked(_pick(serves_b, doa, dob)),
    )
    dqo = g[0].astype(jnp.float32).reshape(M, B, h, *q.shape[2:])
    sel = serves_b[:, None, None, None, None]
    dq = [jnp.sum(jnp.where(sel, 0, dqo), 0), jnp.sum(jnp.where(sel, dqo, 0), 0)]
    dk, dv = _put(k, keys, g[1]), _put(v, keys, g[2])
    cat = lambda x, y: jnp.concatenate([x, y])
    g = blocks.backward(*diagonal, True, None, scale, cat(oa, ob), cat(lsea, lseb), cat(doa, dob))
    dq = jnp.concatenate([dq[0] + g[0][:B], dq[1] + g[0][B:]], 1)

    def add(x, d):
        for c, part in ((a, d[:B]), (b, d[B:])):
            x = jax.lax.dynamic_update_slice_in_dim(
                x, _chunk(x, c, h) + part.astype(x.dtype), c * h, axis=1
            )
        return x

    return dq.astype(q.dtype), add(dk, g[1]), add(dv, g[2])


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _rows(blocks, scale, n, q, k, v, q_seg, kv_seg, index):
    return _forward(blocks, scale, q, k, v, q_seg, kv_seg, index, n)[0]


def _rows_fwd(blocks, scale, n, q, k, v, q_seg, kv_seg, index):
    o, lse = _forward(blocks, scale, q, k, v, q_seg, kv_seg, index, n)
    return o, (q, k, v, q_seg, kv_seg, index, o, lse)


def _rows_bwd(blocks, scale, n, res, do):
    q, k, v, q_seg, kv_seg, index, o, lse = res
    dq, dk, dv = _backward(blocks, scale, q, k, v, q_seg, kv_seg, index, n, o, lse, do)
    return dq, dk, dv, None, None, None


_rows.defvjp(_rows_fwd, _rows_bwd)


def zigzag_rows(
    q, k, v, index, *, shards, scale=None, segment_ids=None, kv_segment_ids=None,
    blocks: Blocks = CUDNN,
):  # fmt: skip
    """Causal attention of a device's two chunks (after ``swap``) over all the keys.

    Args:
      q: [B, L, H, D], chunk a's h = L / 2 queries then chunk b's (``chunks(index, shards)``);
      k, v: [B, shards * L, G, D], every device's keys and values (gathered, in order);
      index: this device's position on the axis (traced); scale: default D**-0.5;
      segment_ids: [B, L] the queries' documents (in q's order), kv_segment_ids: [B, T];
      blocks: ``shard_rows.CUDNN`` (GPU) or ``shard_rows.REFERENCE`` (XLA).
    Returns: [B, L, H, D] in q's dtype: the rows at ``positions`` of causal attention over the
    whole sequence.
    """
    B, L, H, D = q.shape
    if L % 2 or k.shape[1] != shards * L or v.shape != k.shape:
        raise ValueError(
            f"zigzag_rows: need an even number of queries (got {L}) and keys {k.shape} / values "
            f"{v.shape} holding {shards} shards of them"
        )
    if (segment_ids is None) != (kv_segment_ids is None):
        raise ValueError("zigzag_rows: give both segment_ids and kv_segment_ids, or neither")
    scale = D**-0.5 if scale is None else float(scale)
    index = jnp.asarray(index, jnp.int32)
    return _rows(blocks, scale, shards, q, k, v, segment_ids, kv_segment_ids, index)
