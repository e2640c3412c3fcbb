"""Attention for one time shard's queries over the gathered keys, from cuDNN blocks.

Device i of n on a sequence axis holds queries [iL, (i+1)L) and has gathered all T = nL keys.
JAX's cuDNN attention masks causally from the top-left corner (query t of a call sees the
call's keys up to t), so no one call lets query iL + t see keys [0, iL + t]. Blocks do: the
diagonal block (the shard's own L keys, causal) and the blocks of L keys before it, merged by
their log-sum-exps:

    lse = log(sum_b e^lse_b),   O = sum_b e^(lse_b - lse) O_b.

Each block's backward is cuDNN's own run with the merged O and lse in place of the block's: it
forms exp(S - lse) * (dO V^T - rowsum(dO * O)), the gradient of the softmax over the union
restricted to the block (the rule ring attention uses). JAX exposes that backward only through
its cuDNN module's private rules (``_dot_product_attention_fwd_rule`` / ``_bwd_rule``, with the
same arguments and saved values in JAX 0.10 and 0.11); ``supported()`` checks that they are
there, and ``attention`` otherwise computes every query of the gathered sequence.

Shapes are static and alike on every device: the blocks before the diagonal are one call of
m blocks of L keys, gathered by their offset d = 1..m from the shard's own and stacked on the
batch axis (m = n - 1, or with a sliding window w the ceil((w - 1) / L) it reaches); a device
drops the blocks before the sequence's start (weight 0 in the merge; in the backward a zero dO
and an lse that makes their probabilities 0). The devices run in lockstep, so the slowest one
(the last, which uses every block) sets the step either way; a ``lax.switch`` on the device's
position with a prefix of its own length measured slower (docs/training.md). Stacking the
blocks keeps a short shard's calls wide enough to fill the GPU (B x heads x L / 128 thread
blocks a call). The diagonal takes cuDNN's own causal mask and window; a window's band over an
off-diagonal block (query t sees key u of block d iff u - t >= dL - w + 1, a cut from the
bottom-right corner that cuDNN's masks do not express) and documents (same-segment) are a
mask, which cuDNN takes as a bias.

Without a window the last device attends L^2/2 + (n-1)L^2 pairs against (nL)^2/2 when every
device computes every query: 0.75x the work at n = 2, 0.44x at 4, 0.23x at 8.
Without the causal mask (and no window) every block is an off-diagonal one.

``CUDNN`` and ``REFERENCE`` are the two block implementations; the reference (XLA, fp32) is
the same algorithm for the CPU, where the tests hold the merge to ``attention_reference``.
"""

from __future__ import annotations

import functools
import inspect
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from kernels_pallas import compat
from kernels_pallas.attention.reference import same_segment

_HI = jax.lax.Precision.HIGHEST


class Blocks(NamedTuple):
    """forward(q, k, v, mask, causal, window, scale) -> (O, lse [B, H, T] fp32);
    backward(q, k, v, mask, causal, window, scale, O, lse, dO) -> (dq, dk, dv), with O and
    lse the merged ones; ``mask`` [B, 1, T, S] bool or None, ``window`` a sliding window from
    the top-left diagonal (with ``causal``) or None."""

    forward: object
    backward: object


def _cudnn_module():
    fa = compat.cudnn_attention()  # private: see the docstring
    if fa is None:
        raise ImportError("this JAX has no cuDNN attention module")
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


def _cudnn_forward(q, k, v, mask, causal, window, scale):
    fa = _cudnn_module()
    bias, variadic, mask_type, layout = _cudnn_static(fa, q, mask, causal)
    empty = jnp.zeros(0, q.dtype)
    (o, lse), _ = fa._dot_product_attention_fwd_rule(
        q, k, v, empty if bias is None else bias, empty, empty, empty, empty, empty, empty,
        scale, 42, 0.0, variadic, mask_type, layout, window, fa.check_cudnn_version(), True,
    )  # fmt: skip
    return o, lse


def _cudnn_backward(q, k, v, mask, causal, window, scale, o, lse, do):
    fa = _cudnn_module()
    bias, variadic, mask_type, layout = _cudnn_static(fa, q, mask, causal)
    empty = jnp.zeros(0, q.dtype)
    # the saved values of the forward rule, with the merged lse and output as its last two
    res = (q, k, v, empty if bias is None else bias, *(empty,) * 6, lse, o)
    grads = fa._dot_product_attention_bwd_rule(
        scale, 42, 0.0, variadic, mask_type, layout, window, True, False, res, do
    )
    return grads[0], grads[1], grads[2]


CUDNN = Blocks(_cudnn_forward, _cudnn_backward)


def _ref_probs(q, k, mask, causal, window, scale, lse=None):
    """The block's logits [B, G, R, T, S] (fp32, masked to -1e30), and exp(logits - lse)."""
    B, T, H, D = q.shape
    G = k.shape[2]
    qg = q.reshape(B, T, G, H // G, D).astype(jnp.float32)
    s = jnp.einsum("btgrd,bsgd->bgrts", qg, k.astype(jnp.float32), precision=_HI) * scale
    rows, cols = jnp.arange(T)[:, None], jnp.arange(k.shape[1])[None]
    keep = jnp.ones(s.shape[-2:], bool)
    if causal:
        keep &= cols <= rows
    if window is not None:
        keep &= cols > rows - window
    keep = keep[None, None, None]
    if mask is not None:
        keep = keep & mask[:, :, None]
    s = jnp.where(keep, s, -1e30)
    if lse is None:
        return s, None
    return s, jnp.exp(s - lse.reshape(B, G, H // G, T)[..., None])


def _ref_forward(q, k, v, mask, causal, window, scale):
    B, T, H, D = q.shape
    s, _ = _ref_probs(q, k, mask, causal, window, scale)
    lse = jax.nn.logsumexp(s, axis=-1)
    p = jnp.exp(s - lse[..., None])
    o = jnp.einsum("bgrts,bsgd->btgrd", p, v.astype(jnp.float32), precision=_HI)
    return o.reshape(B, T, H, D).astype(q.dtype), lse.reshape(B, H, T)


def _ref_backward(q, k, v, mask, causal, window, scale, o, lse, do):
    B, T, H, D = q.shape
    G = k.shape[2]
    _, p = _ref_probs(q, k, mask, causal, window, scale, lse)
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


class _Layout(NamedTuple):
    """The call beside the diagonal: its m key blocks' positions ``keys`` [m, c] (a NumPy array
    when they are the same on every device), whether each is ``used`` [m], and the queries
    [0, c) it serves (c = L but for a window shorter than the shard, below)."""

    keys: object
    used: object
    c: int


def _layout(causal, window, index, n, L):
    """Without the causal mask: every block, all used. Causal, no window: the blocks [0, n-1)
    before the last shard's, block j used by shard index > j. Causal with a window w: the
    blocks d = 1..m before the shard's own, m = ceil((w - 1) / L) (at most n - 1), unused
    before the sequence's start; when w - 1 < L only the first c ~ w - 1 queries (rounded up to
    64, at most L) see the block before, and only its last c keys."""
    if not causal:
        return _Layout(np.arange(n * L).reshape(n, L), jnp.ones(n, bool), L)
    if window is None:
        return _Layout(np.arange((n - 1) * L).reshape(n - 1, L), jnp.arange(n - 1) < index, L)
    m = min(n - 1, -(-(window - 1) // L))
    c = L if m != 1 else min(L, -(-(window - 1) // 64) * 64)
    d = jnp.arange(1, m + 1)
    first = jnp.maximum(index - d, 0) * L + (L - c)
    return _Layout(first[:, None] + jnp.arange(c), d <= index, c)


def _band(window, layout, L):
    """[m, c, c] bool or None: query t sees key u of the block d = 1..m before the shard's
    own (its last c keys) iff u - t >= (d - 1) L + c - window + 1 (None: all of every block)."""
    m, c = layout.keys.shape[0], layout.c
    if window is None or m == 0 or -(c - 1) >= (m - 1) * L + c - window + 1:
        return None
    d = np.arange(1, m + 1)[:, None, None]
    t, u = np.arange(c)[:, None], np.arange(c)[None]
    return u - t >= (d - 1) * L + c - window + 1


def _leading(keys) -> bool:
    """Whether ``keys`` are the sequence's first keys in order on every device (a slice)."""
    return isinstance(keys, np.ndarray) and (keys.ravel() == np.arange(keys.size)).all()


def _take(x, keys):
    """x [B, T, ...] at keys [m, c] -> [m B, c, ...], block-major."""
    B, (m, c) = x.shape[0], keys.shape
    if _leading(keys):
        x = x[:, : m * c]
    else:
        x = jnp.take(x, keys.reshape(-1), axis=1)
    x = x.reshape(B, m, c, *x.shape[2:])
    return jnp.swapaxes(x, 0, 1).reshape(m * B, c, *x.shape[3:])


def _put(like, keys, x):
    """The transpose of ``_take``: x [m B, c, ...] placed into zeros like ``like`` at keys."""
    m = keys.shape[0]
    B = x.shape[0] // m
    x = jnp.swapaxes(x.reshape(m, B, *x.shape[1:]), 0, 1).reshape(B, -1, *x.shape[2:])
    x = x.astype(like.dtype)
    if _leading(keys):
        return jnp.zeros_like(like).at[:, : x.shape[1]].set(x)
    return jnp.zeros_like(like).at[:, keys.reshape(-1)].add(x)


def _tile(x, m):
    return jnp.tile(x, (m,) + (1,) * (x.ndim - 1))


def _diagonal(x, index, L):
    return None if x is None else jax.lax.dynamic_slice_in_dim(x, index * L, L, axis=1)


def _on_diagonal(q_seg, k, v, kv_seg, index, L):
    """The diagonal call's keys, values and document mask (the shard's own L keys)."""
    k, v, kv_seg = (_diagonal(x, index, L) for x in (k, v, kv_seg))
    return k, v, same_segment(q_seg, kv_seg)


def _off_diagonal(q, k, v, q_seg, kv_seg, layout, window):
    """The off-diagonal call's inputs: the queries [0, c) repeated over the m blocks, the
    blocks' keys and values, and their mask (documents, the window's band) or None."""
    keys, c = layout.keys, layout.c
    m, B, L = keys.shape[0], q.shape[0], q.shape[1]
    mask = None
    if q_seg is not None:
        mask = same_segment(_tile(q_seg[:, :c], m), _take(kv_seg, keys))
    band = _band(window, layout, L)
    if band is not None:
        band = jnp.asarray(band).repeat(B, axis=0)[:, None]
        mask = band if mask is None else mask & band
    return _tile(q[:, :c], m), _take(k, keys), _take(v, keys), mask


def _forward(blocks, causal, window, scale, q, k, v, q_seg, kv_seg, index):
    B, L, H, _ = q.shape
    layout = _layout(causal, window, index, k.shape[1] // L, L)
    m, c = layout.keys.shape[0], layout.c
    o_parts, lse_parts = [], []
    if causal:
        o, lse = blocks.forward(
            q, *_on_diagonal(q_seg, k, v, kv_seg, index, L), True, window, scale
        )
        o_parts.append(o[None])
        lse_parts.append(lse[None])
    if m:
        o, lse = blocks.forward(*_off_diagonal(q, k, v, q_seg, kv_seg, layout, window),
                                False, None, scale)  # fmt: skip
        lse = jnp.where(layout.used[:, None, None, None], lse.reshape(m, B, H, c), -jnp.inf)
        # the queries past c see nothing of these blocks
        o_parts.append(
            jnp.pad(o.reshape(m, B, c, H, -1), ((0, 0), (0, 0), (0, L - c), (0, 0), (0, 0)))
        )
        lse_parts.append(jnp.pad(lse, ((0, 0),) * 3 + ((0, L - c),), constant_values=-jnp.inf))
    lse_parts = jnp.concatenate(lse_parts)  # [blocks, B, H, L]
    lse = jax.nn.logsumexp(lse_parts, axis=0)
    weights = jnp.exp(lse_parts - lse).transpose(0, 1, 3, 2)[..., None]  # [blocks, B, L, H, 1]
    o = jnp.sum(jnp.concatenate(o_parts).astype(jnp.float32) * weights, axis=0)
    return o.astype(q.dtype), lse


def _backward(blocks, causal, window, scale, q, k, v, q_seg, kv_seg, index, o, lse, do):
    L = q.shape[1]
    layout = _layout(causal, window, index, k.shape[1] // L, L)
    m, c = layout.keys.shape[0], layout.c
    dq = jnp.zeros(q.shape, jnp.float32)
    dk, dv = jnp.zeros_like(k), jnp.zeros_like(v)
    if m:
        # an unused block gets dO = 0 and an lse so large that its probabilities are 0
        keep = layout.used.repeat(q.shape[0])
        lse_m = jnp.where(keep[:, None, None], _tile(lse[..., :c], m), 1e30)
        do_m = jnp.where(keep[:, None, None, None], _tile(do[:, :c], m), 0)
        inputs = _off_diagonal(q, k, v, q_seg, kv_seg, layout, window)
        g = blocks.backward(*inputs, False, None, scale, _tile(o[:, :c], m), lse_m, do_m)
        dq = dq.at[:, :c].add(
            g[0].astype(jnp.float32).reshape(m, q.shape[0], c, *q.shape[2:]).sum(0)
        )
        dk, dv = _put(k, layout.keys, g[1]), _put(v, layout.keys, g[2])
    if causal:
        diag = _on_diagonal(q_seg, k, v, kv_seg, index, L)
        g = blocks.backward(q, *diag, True, window, scale, o, lse, do)
        dq = dq + g[0].astype(jnp.float32)
        add = lambda x, d: jax.lax.dynamic_update_slice_in_dim(
            x, _diagonal(x, index, L) + d.astype(x.dtype), index * L, axis=1
        )
        dk, dv = add(dk, g[1]), add(dv, g[2])
    return dq.astype(q.dtype), dk, dv


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2, 3))
def _rows(blocks, causal, window, scale, q, k, v, q_seg, kv_seg, index):
    return _forward(blocks, causal, window, scale, q, k, v, q_seg, kv_seg, index)[0]


def _rows_fwd(blocks, causal, window, scale, q, k, v, q_seg, kv_seg, index):
    o, lse = _forward(blocks, causal, window, scale, q, k, v, q_seg, kv_seg, index)
    return o, (q, k, v, q_seg, kv_seg, index, o, lse)


def _rows_bwd(blocks, causal, window, scale, res, do):
    dq, dk, dv = _backward(blocks, causal, window, scale, *res, do)
    return dq, dk, dv, None, None, None


_rows.defvjp(_rows_fwd, _rows_bwd)


def shard_rows(
    q, k, v, index, *, shards, causal=True, window=None, scale=None, segment_ids=None,
    kv_segment_ids=None, blocks: Blocks = CUDNN,
):  # fmt: skip
    """Attention of one time shard's queries over all the keys.

    Args:
      q: [B, L, H, D], the queries of shard ``index`` (a traced int) of ``shards``;
      k, v: [B, shards * L, G, D], every shard's keys and values (gathered);
      causal: mask keys after each query's global position; window: keys in [t - window + 1,
        t] only (with ``causal``); scale: default D**-0.5;
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
    if window is not None and (not causal or window < 1):
        raise ValueError(f"shard_rows: a window (got {window}) needs causal=True and >= 1")
    if (segment_ids is None) != (kv_segment_ids is None):
        raise ValueError("shard_rows: give both segment_ids and kv_segment_ids, or neither")
    scale = D**-0.5 if scale is None else float(scale)
    index = jnp.asarray(index, jnp.int32)
    return _rows(blocks, causal, window, scale, q, k, v, segment_ids, kv_segment_ids, index)
