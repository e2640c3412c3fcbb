"""Causal attention for one time shard's queries over the gathered keys, from cuDNN blocks.

Device i of n on a sequence axis holds queries [iL, (i+1)L) and has gathered all T = nL keys.
JAX's cuDNN attention masks causally from the top-left corner (query t of a call sees the
call's keys up to t), so no one call lets query iL + t see keys [0, iL + t]. Blocks do: the
diagonal block (the shard's own L keys, causal) and the prefix's blocks of L keys (no mask),
merged by their log-sum-exps:

    lse = log(sum_b e^lse_b),   O = sum_b e^(lse_b - lse) O_b.

Each block's backward is cuDNN's own run with the merged O and lse in place of the block's: it
forms exp(S - lse) * (dO V^T - rowsum(dO * O)), the gradient of the softmax over the union
restricted to the block (the rule ring attention uses). JAX exposes that backward only through
its cuDNN module's private rules (``_dot_product_attention_fwd_rule`` / ``_bwd_rule``, with the
same arguments and saved values in JAX 0.10 and 0.11); ``supported()`` checks that they are
there, and ``attention`` otherwise computes every query of the gathered sequence.

Shapes are static and alike on every device: the prefix is one call of the n - 1 blocks
[0, (n-1)L) stacked on the batch axis, and a device drops the blocks at or past its own (weight
0 in the merge; in the backward a zero dO and an lse that makes their probabilities 0). The
devices run in lockstep, so the slowest one (the last, which needs every block) sets the step
either way; a ``lax.switch`` on the device's position with a prefix of its own length measured
slower (docs/training.md). Stacking the blocks keeps a short
shard's calls wide enough to fill the GPU (B x heads x L / 128 thread blocks a call).
Documents are a same-segment mask per block (cuDNN's bias). Sliding windows are not taken: the
prefix would need a band from the bottom-right corner.

The last device attends L^2/2 + (n-1)L^2 pairs against (nL)^2/2 when every device computes
every query: 0.75x the work at n = 2, 0.44x at 4, 0.23x at 8.

``CUDNN`` and ``REFERENCE`` are the two block implementations; the reference (XLA, fp32) is
the same algorithm for the CPU, where the tests hold the merge to ``attention_reference``.
"""

from __future__ import annotations

import functools
import inspect
from typing import NamedTuple

import jax
import jax.numpy as jnp

_HI = jax.lax.Precision.HIGHEST


class Blocks(NamedTuple):
    """forward(q, k, v, mask, causal, scale) -> (O, lse [B, H, T] fp32);
    backward(q, k, v, mask, causal, scale, O, lse, dO) -> (dq, dk, dv), with O and lse the
    merged ones."""

    forward: object
    backward: object


def _cudnn_module():
    from jax._src.cudnn import fused_attention_stablehlo as fa  # private: see the docstring

    return fa


# the private rules' parameters as JAX 0.10 and 0.11 have them (the calls below pass them by
# position); another JAX whose rules differ takes the path that computes every query
_FWD_PARAMS = (
    "query", "key", "value", "bias", "q_seqlen", "kv_seqlen", "q_offsets", "kv_offsets",
    "page_table_k", "page_table_v", "scale", "seed", "dropout_rate", "variadic_args",
    "mask_type", "layout", "sliding_window_length", "cudnn_version", "return_residual",
)  # fmt: skip
_BWD_PARAMS = (
    "scale", "seed", "dropout_rate", "variadic_args", "mask_type", "layout",
    "sliding_window_length", "is_training", "return_residual", "res", "grad_output",
)  # fmt: skip


@functools.cache
def supported() -> bool:
    """Whether this JAX has the cuDNN rules the blocks call, with the parameters they pass."""
    try:
        fa = _cudnn_module()
        fwd = inspect.signature(fa._dot_product_attention_fwd_rule).parameters
        bwd = inspect.signature(fa._dot_product_attention_bwd_rule).parameters
        names = ("combine_bias_and_mask", "check_cudnn_version", "MaskType", "AttentionLayout")
    except (ImportError, AttributeError):
        return False
    return (
        tuple(fwd) == _FWD_PARAMS
        and tuple(bwd) == _BWD_PARAMS
        and all(hasattr(fa, n) for n in names)
    )


def _cudnn_static(fa, q, mask, causal):
    bias = None if mask is None else fa.combine_bias_and_mask(None, mask, q.dtype)
    mask_type = fa.MaskType.CAUSAL if causal else fa.MaskType.NO_MASK
    return bias, (bias is not None, False), mask_type, fa.AttentionLayout.BTNH.value


def _cudnn_forward(q, k, v, mask, causal, scale):
    fa = _cudnn_module()
    bias, variadic, mask_type, layout = _cudnn_static(fa, q, mask, causal)
    empty = jnp.zeros(0, q.dtype)
    (o, lse), _ = fa._dot_product_attention_fwd_rule(
        q, k, v, empty if bias is None else bias, empty, empty, empty, empty, empty, empty,
        scale, 42, 0.0, variadic, mask_type, layout, None, fa.check_cudnn_version(), True,
    )  # fmt: skip
    return o, lse


def _cudnn_backward(q, k, v, mask, causal, scale, o, lse, do):
    fa = _cudnn_module()
    bias, variadic, mask_type, layout = _cudnn_static(fa, q, mask, causal)
    empty = jnp.zeros(0, q.dtype)
    # the saved values of the forward rule, with the merged lse and output as its last two
    res = (q, k, v, empty if bias is None else bias, *(empty,) * 6, lse, o)
    grads = fa._dot_product_attention_bwd_rule(
        scale, 42, 0.0, variadic, mask_type, layout, None, True, False, res, do
    )
    return grads[0], grads[1], grads[2]


CUDNN = Blocks(_cudnn_forward, _cudnn_backward)


def _ref_probs(q, k, mask, causal, scale, lse=None):
    """The block's logits [B, G, R, T, S] (fp32, masked to -1e30), and exp(logits - lse)."""
    B, T, H, D = q.shape
    G = k.shape[2]
    qg = q.reshape(B, T, G, H // G, D).astype(jnp.float32)
    s = jnp.einsum("btgrd,bsgd->bgrts", qg, k.astype(jnp.float32), precision=_HI) * scale
    keep = jnp.ones(s.shape[-2:], bool)
    if causal:
        keep = jnp.tril(keep)
    keep = keep[None, None, None]
    if mask is not None:
        keep = keep & mask[:, :, None]
    s = jnp.where(keep, s, -1e30)
    if lse is None:
        return s, None
    return s, jnp.exp(s - lse.reshape(B, G, H // G, T)[..., None])


def _ref_forward(q, k, v, mask, causal, scale):
    B, T, H, D = q.shape
    s, _ = _ref_probs(q, k, mask, causal, scale)
    lse = jax.nn.logsumexp(s, axis=-1)
    p = jnp.exp(s - lse[..., None])
    o = jnp.einsum("bgrts,bsgd->btgrd", p, v.astype(jnp.float32), precision=_HI)
    return o.reshape(B, T, H, D).astype(q.dtype), lse.reshape(B, H, T)


def _ref_backward(q, k, v, mask, causal, scale, o, lse, do):
    B, T, H, D = q.shape
    G = k.shape[2]
    _, p = _ref_probs(q, k, mask, causal, scale, lse)
    dog = do.reshape(B, T, G, H // G, D).astype(jnp.float32)
    og = o.reshape(B, T, G, H // G, D).astype(jnp.float32)
    qg = q.reshape(B, T, G, H // G, D).astype(jnp.float32)
    dv = jnp.einsum("bgrts,btgrd->bsgd", p, dog, precision=_HI)
    dp = jnp.einsum("btgrd,bsgd->bgrts", dog, v.astype(jnp.float32), precision=_HI)
    rowsum = jnp.einsum("btgrd,btgrd->bgrt", dog, og, precision=_HI)
    ds = p * (dp - rowsum[..., None]) * scale
    dq = jnp.einsum("bgrts,bsgd->btgrd", ds, k.astype(jnp.float32), precision=_HI)
    dk = jnp.einsum("bgrts,btgrd->bsgd", ds, qg, precision=_HI)
    return dq.reshape(q.shape).astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype)


REFERENCE = Blocks(_ref_forward, _ref_backward)


def _stack(x, m, L):
    """x[:, : m L] [B, m L, ...] -> [m B, L, ...], block-major."""
    B = x.shape[0]
    x = x[:, : m * L].reshape(B, m, L, *x.shape[2:])
    return jnp.swapaxes(x, 0, 1).reshape(m * B, L, *x.shape[3:])


def _unstack(x, m):
    """[m B, L, ...] -> [B, m L, ...]: the inverse of ``_stack``."""
    B = x.shape[0] // m
    x = jnp.swapaxes(x.reshape(m, B, *x.shape[1:]), 0, 1)
    return x.reshape(B, m * x.shape[2], *x.shape[3:])


def _tile(x, m):
    return jnp.tile(x, (m,) + (1,) * (x.ndim - 1))


def _same(q_seg, kv_seg):
    return None if q_seg is None else (q_seg[:, :, None] == kv_seg[:, None, :])[:, None]


def _diagonal(x, index, L):
    return None if x is None else jax.lax.dynamic_slice_in_dim(x, index * L, L, axis=1)


def _prefix(q, k, v, q_seg, kv_seg, m):
    """The prefix call's inputs: q repeated m times over the first m key blocks."""
    L = q.shape[1]
    seg = None if q_seg is None else (_tile(q_seg, m), _stack(kv_seg, m, L))
    return _tile(q, m), _stack(k, m, L), _stack(v, m, L), None if seg is None else _same(*seg)


def _layout(causal, index, n):
    """(prefix blocks m, whether each is used [m] bool): causal rows use the blocks before
    their own and a diagonal block; non-causal rows use every block and no diagonal."""
    m = n - 1 if causal else n
    used = jnp.arange(m) < index if causal else jnp.ones(m, bool)
    return m, used


def _forward(blocks, causal, scale, q, k, v, q_seg, kv_seg, index):
    B, L, H, _ = q.shape
    m, used = _layout(causal, index, k.shape[1] // L)
    o_parts, lse_parts = [], []
    if causal:
        diag = [_diagonal(x, index, L) for x in (k, v, kv_seg)]
        o, lse = blocks.forward(q, diag[0], diag[1], _same(q_seg, diag[2]), True, scale)
        o_parts.append(o[None])
        lse_parts.append(lse[None])
    if m:
        o, lse = blocks.forward(*_prefix(q, k, v, q_seg, kv_seg, m), False, scale)
        o_parts.append(o.reshape(m, *q.shape))
        lse_parts.append(jnp.where(used[:, None, None, None], lse.reshape(m, B, H, L), -jnp.inf))
    lse_parts = jnp.concatenate(lse_parts)  # [blocks, B, H, L]
    lse = jax.nn.logsumexp(lse_parts, axis=0)
    weights = jnp.exp(lse_parts - lse).transpose(0, 1, 3, 2)[..., None]  # [blocks, B, L, H, 1]
    o = jnp.sum(jnp.concatenate(o_parts).astype(jnp.float32) * weights, axis=0)
    return o.astype(q.dtype), lse


def _backward(blocks, causal, scale, q, k, v, q_seg, kv_seg, index, o, lse, do):
    L = q.shape[1]
    m, used = _layout(causal, index, k.shape[1] // L)
    dq = jnp.zeros(q.shape, jnp.float32)
    dk, dv = jnp.zeros_like(k), jnp.zeros_like(v)
    if m:
        # an unused block gets dO = 0 and an lse so large that its probabilities are 0
        keep = used.repeat(q.shape[0])
        lse_m = jnp.where(keep[:, None, None], _tile(lse, m), 1e30)
        do_m = jnp.where(keep[:, None, None, None], _tile(do, m), 0)
        g = blocks.backward(*_prefix(q, k, v, q_seg, kv_seg, m), False, scale,
                            _tile(o, m), lse_m, do_m)  # fmt: skip
        dq = dq + g[0].astype(jnp.float32).reshape(m, *q.shape).sum(0)
        dk, dv = dk.at[:, : m * L].set(_unstack(g[1], m)), dv.at[:, : m * L].set(_unstack(g[2], m))
    if causal:
        diag = [_diagonal(x, index, L) for x in (k, v, kv_seg)]
        g = blocks.backward(q, diag[0], diag[1], _same(q_seg, diag[2]), True, scale, o, lse, do)
        dq = dq + g[0].astype(jnp.float32)
        add = lambda x, d: jax.lax.dynamic_update_slice_in_dim(
            x, _diagonal(x, index, L) + d.astype(x.dtype), index * L, axis=1
        )
        dk, dv = add(dk, g[1]), add(dv, g[2])
    return dq.astype(q.dtype), dk, dv


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _rows(blocks, causal, scale, q, k, v, q_seg, kv_seg, index):
    return _forward(blocks, causal, scale, q, k, v, q_seg, kv_seg, index)[0]


def _rows_fwd(blocks, causal, scale, q, k, v, q_seg, kv_seg, index):
    o, lse = _forward(blocks, causal, scale, q, k, v, q_seg, kv_seg, index)
    return o, (q, k, v, q_seg, kv_seg, index, o, lse)


def _rows_bwd(blocks, causal, scale, res, do):
    dq, dk, dv = _backward(blocks, causal, scale, *res, do)
    return dq, dk, dv, None, None, None


_rows.defvjp(_rows_fwd, _rows_bwd)


def shard_rows(
    q, k, v, index, *, shards, causal=True, scale=None, segment_ids=None, kv_segment_ids=None,
    blocks: Blocks = CUDNN,
):  # fmt: skip
    """Attention of one time shard's queries over all the keys.

    Args:
      q: [B, L, H, D], the queries of shard ``index`` (a traced int) of ``shards``;
      k, v: [B, shards * L, G, D], every shard's keys and values (gathered);
      causal: mask keys after each query's global position; scale: default D**-0.5;
      segment_ids: [B, L] the queries' documents, kv_segment_ids: [B, shards * L] the keys';
      blocks: ``CUDNN`` (GPU) or ``REFERENCE`` (XLA).
    Returns: [B, L, H, D] in q's dtype, equal to rows [index * L, (index + 1) * L) of
    ``attention_reference`` over the whole sequence.
    """
    B, L, H, D = q.shape
    if k.shape[1] != shards * L or v.shape != k.shape:
        raise ValueError(
            f"shard_rows: keys {k.shape} / values {v.shape} must hold {shards} shards of the "
            f"{L} queries"
        )
    if (segment_ids is None) != (kv_segment_ids is None):
        raise ValueError("shard_rows: give both segment_ids and kv_segment_ids, or neither")
    scale = D**-0.5 if scale is None else float(scale)
    index = jnp.asarray(index, jnp.int32)
    return _rows(blocks, causal, scale, q, k, v, segment_ids, kv_segment_ids, index)
