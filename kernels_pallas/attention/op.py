"""``attention``: the public entry, which checks shapes and runs the implementation its
``AttentionSettings`` choose. Under ``kernel_mesh`` the cuDNN and splash kernels run per shard
(``shard_map``: batch rows over the batch axes, heads over the tensor axis): left to GSPMD,
cuDNN's partitioner rejects an FSDP step ("Query, key and value should have same sharding").
Over a sequence axis each device gathers the keys and values (``_over_time_shards``) and,
for causal attention without a window, first swaps half its queries with the mirror device so
that every device attends as many pairs (``zigzag``; ``AttentionSettings.balance``): splash
with its rows of the mask tables (in the swapped order), the reference with its rows of the
mask, cuDNN as blocks merged by log-sum-exp (``zigzag_rows``, or ``shard_rows`` for a
device's own queries). cuDNN under a JAX without
the private rules ``shard_rows`` calls, or with documents or a window at an odd shard length,
computes every query of the gathered sequence on each device of that axis (JAX's cuDNN mask
has no query offset).
Elsewhere the reference is plain XLA and stays with GSPMD."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from kernels_pallas import dispatch, sharding
from kernels_pallas.attention import shard_rows, zigzag
from kernels_pallas.attention.reference import attention_blocked, attention_reference, same_segment
from kernels_pallas.attention.settings import AttentionSettings


def _cudnn_ok(q):
    return q.dtype in (jnp.bfloat16, jnp.float16) and q.shape[-1] <= 128 and q.shape[-1] % 8 == 0


def _time_shards(T: int) -> int:
    """How many devices the current ``kernel_mesh`` splits a time dimension of T over."""
    km = sharding.current()
    axis = km.seq_spec(T) if km is not None else None
    return 1 if axis is None else km.mesh.shape[axis]


def choose(settings: AttentionSettings, q, *, window=None, segment_ids=None) -> str:
    """The implementation ``attention`` runs for these inputs."""
    if settings.impl != "auto":
        return settings.impl
    platform = settings.target()
    # cuDNN takes documents as a bias, and its backward with a bias needs an even length
    if platform == "gpu" and _cudnn_ok(q) and (segment_ids is None or q.shape[1] % 2 == 0):
        return "cudnn"
    if platform == "tpu":
        from kernels_pallas.attention import tpu

        if tpu.supported(q.shape[1], q.shape[-1], _time_shards(q.shape[1])):
            return "splash"
    return "reference"


def attention(
    q,
    k,
    v,
    *,
    causal=True,
    window=None,
    scale=None,
    segment_ids=None,
    settings: AttentionSettings | None = None,
):
    """Multi-head attention with grouped kv heads.

    Args:
      q: [B, T, H, D]; k, v: [B, T, G, D] with H % G == 0.
      causal: mask keys after the query; window: keys in [t - window + 1, t] only (SWA).
      scale: logit scale, default D**-0.5; segment_ids: [B, T] ints, attend within a segment.
      settings: which implementation (default ``AttentionSettings()``).
    Returns: [B, T, H, D] in q's dtype.
    """
    settings = AttentionSettings() if settings is None else settings
    if q.ndim != 4 or k.ndim != 4 or v.shape != k.shape:
        raise ValueError(
            f"attention: need q [B,T,H,D], k=v [B,T,G,D]; got {q.shape}, {k.shape}, {v.shape}"
        )
    B, T, H, D = q.shape
    G = k.shape[2]
    if k.shape[0] != B or k.shape[3] != D or k.shape[1] != T:
        raise ValueError(f"attention: k shape {k.shape} does not match q shape {q.shape}")
    if H % G:
        raise ValueError(f"attention: {H} query heads not divisible by {G} kv heads")
    if window is not None and window < 1:
        raise ValueError(f"attention: window must be >= 1, got {window}")
    impl = dispatch.record(settings, choose(settings, q, window=window, segment_ids=segment_ids))
    km = sharding.current()
    axis = km.seq_spec(T) if km is not None else None
    if axis is not None and (
        impl in ("reference", "blocked", "splash")
        or (impl == "cudnn" and _rows_ok(km, axis, T, causal, window, segment_ids))
    ):
        balance = settings.balance and _balance_ok(
            km.mesh.shape[axis], impl, T, D, causal, window, segment_ids
        )
        return _over_time_shards(
            km, axis, impl, q, k, v, causal, window, scale, segment_ids, settings.interpret,
            balance, settings.block_q,
        )  # fmt: skip
    if impl in ("reference", "blocked"):
        return _xla(impl, settings.block_q)(
            q, k, v, causal=causal, window=window, scale=scale, segment_ids=segment_ids
        )
    kernel = functools.partial(
        _kernel, impl, causal=causal, window=window, scale=scale, interpret=settings.interpret
    )
    args = (q, k, v) if segment_ids is None else (q, k, v, segment_ids)
    if km is None:
        return kernel(*args)
    h = km.head_spec(G) if km.head_spec(H) else None  # q and kv heads split alike or not at all
    qkv = sharding.P(km.batch_spec(B), None, h, None)
    specs = (qkv,) * 3 + (() if segment_ids is None else (sharding.P(km.batch_spec(B), None),))
    return sharding.per_shard(kernel, km, specs, qkv)(*args)


def _rows_ok(km, axis, T, causal, window, segment_ids) -> bool:
    """Whether cuDNN can take each device's rows alone (``shard_rows``): JAX's private cuDNN
    rules present, a window only with the causal mask, and with documents or a window (cuDNN
    takes their masks as a bias) an even shard length (its backward with a bias needs one)."""
    L = T // km.mesh.shape[axis]
    biased = segment_ids is not None or window is not None
    return shard_rows.supported() and (causal or window is None) and (not biased or L % 2 == 0)


def _balance_ok(n, impl, T, D, causal, window, segment_ids) -> bool:
    """Whether the swap of ``zigzag`` applies: causal attention without a window (a window's
    work is even already) over n > 1 devices, each holding two chunks of h = T / 2n queries;
    splash needs h a multiple of its block, cuDNN with documents (a bias) an even h."""
    h, rest = divmod(T, 2 * n)
    if n < 2 or rest or not causal or window is not None:
        return False
    if impl == "splash":
        from kernels_pallas.attention import tpu

        return tpu.supported(T, D, 2 * n)
    return impl != "cudnn" or segment_ids is None or h % 2 == 0


def _xla(impl, block_q):
    """The XLA attention ``impl`` names: the reference, or the reference by query blocks."""
    if impl == "blocked":
        return functools.partial(attention_blocked, block_q=block_q)
    return attention_reference


def _over_time_shards(
    km, axis, impl, q, k, v, causal, window, scale, segment_ids, interpret, balance=False,
    block_q=1024,
):  # fmt: skip
    """Attention with the time dimension over ``axis``: each device gathers the keys and
    values (and their segment ids) and computes T / n queries, masking by global position:
    its own, or with ``balance`` its first half and the mirror device's second half
    (``zigzag.swap``, undone on the outputs). The reference masks its scores from each chunk's
    offset; splash runs its rows of the whole sequence's block tables (``tpu.sharded_kernel``,
    rows in the swapped order with ``balance``); cuDNN runs ``zigzag_rows`` or ``shard_rows``
    (the diagonal blocks and the ones before them, merged). Batch rows and kv groups are split
    as for the other kernels."""
    n = km.mesh.shape[axis]
    b = km.batch_spec(q.shape[0])
    h = km.head_spec(k.shape[2]) if km.head_spec(q.shape[2]) else None
    x = sharding.P(b, axis, h, None)
    if impl == "splash":
        from kernels_pallas.attention import tpu

        kernel = tpu.sharded_kernel(
            q.shape[1], q.shape[2] // k.shape[2], causal, window, interpret, n, balance
        )
        tables = kernel.manual_sharding_spec(
            jax.sharding.NamedSharding(km.mesh, sharding.P(None, axis))
        )
    else:
        kernel, tables = None, None
    args, specs = (kernel, q, k, v), (tables, x, x, x)
    if segment_ids is not None:
        args, specs = (*args, segment_ids), (*specs, sharding.P(b, axis))

    def local(kernel, q, k, v, seg=None):
        gather = functools.partial(jax.lax.all_gather, axis_name=axis, axis=1, tiled=True)
        k, v, kv_seg = gather(k), gather(v), None if seg is None else gather(seg)
        if balance:
            o = balanced(kernel, zigzag.swap(q, axis, n), k, v, seg, kv_seg)
            return zigzag.swap(o, axis, n)  # each device's rows back to it
        if impl == "cudnn":
            return shard_rows.shard_rows(
                q,
                k,
                v,
                jax.lax.axis_index(axis),
                shards=km.mesh.shape[axis],
                causal=causal,
                window=window,
                scale=scale,
                segment_ids=seg,
                kv_segment_ids=kv_seg,
                blocks=shard_rows.CUDNN,
            )
        if kernel is not None:
            return tpu.run(kernel, q, k, v, scale, seg, kv_seg)
        return _xla(impl, block_q)(
            q,
            k,
            v,
            causal=causal,
            window=window,
            scale=scale,
            segment_ids=seg,
            q_offset=jax.lax.axis_index(axis) * q.shape[1],
            kv_segment_ids=kv_seg,
        )

    def balanced(kernel, q, k, v, seg, kv_seg):
        """q: this device's chunks a and b (``zigzag.chunks``), h = L / 2 rows each."""
        index, h = jax.lax.axis_index(axis), q.shape[1] // 2
        a, b = zigzag.chunks(index, n)
        if seg is not None:  # the queries' documents, read from the gathered keys'
            seg = zigzag.rows(kv_seg, index, n)
        if impl == "cudnn":
            return zigzag.zigzag_rows(
                q, k, v, index, shards=n, scale=scale, segment_ids=seg, kv_segment_ids=kv_seg,
                blocks=shard_rows.CUDNN,
            )  # fmt: skip
        if kernel is not None:
            return tpu.run(kernel, q, k, v, scale, seg, kv_seg)
        part = lambda x, c, i: _xla(impl, block_q)(
            x[:, i * h : (i + 1) * h], k, v, causal=True, scale=scale, q_offset=c * h,
            segment_ids=None if seg is None else seg[:, i * h : (i + 1) * h],
            kv_segment_ids=kv_seg,
        )  # fmt: skip
        return jnp.concatenate([part(q, a, 0), part(q, b, 1)], axis=1)

    return sharding.per_shard(local, km, specs, x)(*args)


def _kernel(impl, q, k, v, segment_ids=None, *, causal, window, scale, interpret):
    if impl == "cudnn":
        # documents as a mask, which cuDNN takes as a [B, 1, T, T] bias (T^2 a row in memory)
        same = same_segment(segment_ids, segment_ids)
        return jax.nn.dot_product_attention(
            q,
            k,
            v,
            mask=same,
            scale=scale,
            is_causal=causal,
            implementation="cudnn",
            local_window_size=None if window is None else (window - 1, 0),
        )
    from kernels_pallas.attention.tpu import splash_attention

    return splash_attention(
        q,
        k,
        v,
        causal=causal,
        window=window,
        scale=scale,
        segment_ids=segment_ids,
        interpret=interpret,
    )
