"""The language model's training loss: mean masked token cross entropy of the LM head's logits
(+ PaLM's z-loss), in two forms with the same values.

``cross_entropy(logits, ...)``: the unfused form, autodiff through the logits; ``token_nll``'s
hand-written backward writes d logits in the logits' dtype in one pass. The evaluation and
``loss_impl = "unfused"`` use it.

``head_loss(h, w, ...)``: the LM head and the loss as one op whose forward also computes the
gradient:

    total = mean_masked(nll(h @ W)) + z_loss * mean_masked(logZ^2)

Autodiff of ``cross_entropy(h @ W)`` passes over the [N, V] logits three times (the forward's
max and sum of exp, the backward's softmax - one-hot) and keeps them alive from the forward to
the backward. The gradient of a mean loss with respect to the logits is known in the forward,
up to the scalar cotangent of the loss: ``kernels_pallas.softmax_xent`` computes nll, logZ and
that gradient d in one read of the logits (one kernel on a GPU), the forward goes on to
dh = d W^T and dW = h^T d, and the backward only scales those two by the cotangent. Only
``total`` is differentiable there: the per-token nll and logZ come back through
``stop_gradient`` (metrics), so the VJP never sees their cotangents.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from kernels_pallas.softmax_xent import SoftmaxXentSettings, softmax_xent, xent_grad, xent_stats

LOSS_IMPLS = ("unfused",) + SoftmaxXentSettings.IMPLS  # "unfused" or head_loss's kernel impl


@jax.custom_vjp
def token_nll(logits, targets):
    """logits [..., V] (any float dtype, the math in fp32), int targets [...] -> (negative log
    likelihood, log Z), both fp32 [...].

    The backward writes d logits in the logits' dtype in one pass (softmax - one-hot, scaled by
    the cotangents) from the saved logits and log Z: no fp32 [..., V] array is stored or written,
    which for the bf16 logits of a 50k vocabulary is the training step's largest tensor."""
    return _token_nll_fwd(logits, targets)[0]


def _token_nll_fwd(logits, targets):
    nll, logz = xent_stats(logits, targets)
    return (nll, logz), (logits, targets, logz)


def _token_nll_bwd(res, cts):
    logits, targets, logz = res
    d_nll, d_logz = cts
    return xent_grad(logits, targets, logz, d_nll, d_nll + d_logz), None


token_nll.defvjp(_token_nll_fwd, _token_nll_bwd)


def cross_entropy(logits, targets, mask, z_loss: float = 0.0):
    """Mean masked token cross entropy (+ z_loss * mean log(Z)^2, PaLM) and token count."""
    nll, logz = token_nll(logits, targets)
    count = jnp.maximum(mask.sum(), 1.0)
    loss = (nll * mask).sum() / count
    zl = z_loss * ((logz**2) * mask).sum() / count if z_loss else 0.0
    return loss, zl, mask.sum()


f32 = jnp.float32


def head_loss(
    h, w, targets, mask, *, z_loss: float = 0.0, settings: SoftmaxXentSettings | None = None
):
    """h [..., d] and w [d, V] in the compute dtype, int targets [...], mask [...] ->
    (total, loss, zl, tokens): ``total = loss + zl`` is the differentiable training loss,
    ``loss`` the mean masked nll and ``zl`` the z-loss term (both stop_gradient'ed), ``tokens``
    the mask's sum. The same values as ``cross_entropy(h @ w, targets, mask, z_loss)``.
    ``settings``: the ``softmax_xent`` kernel's."""
    if h.shape[-1] != w.shape[0] or h.shape[:-1] != targets.shape or mask.shape != targets.shape:
        raise ValueError(
            f"head_loss: h [..., d], w [d, V], targets and mask [...], got "
            f"{h.shape}, {w.shape}, {targets.shape}, {mask.shape}"
        )
    count = jnp.maximum(mask.sum(), 1.0)
    a = mask.reshape(-1).astype(f32) / count
    b = (2.0 * z_loss) * a
    settings = SoftmaxXentSettings() if settings is None else settings
    total, nll, logz = _fused(h.reshape(-1, h.shape[-1]), w, targets.reshape(-1), a, b, settings)
    nll, logz = jax.lax.stop_gradient(nll), jax.lax.stop_gradient(logz)
    loss = (nll * a).sum()
    zl = z_loss * (logz * logz * a).sum() if z_loss else 0.0
    return total, loss, zl, mask.sum()


def _dot(x, y, contract):
    return jax.lax.dot_general(x, y, (contract, ((), ())))


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _fused(h, w, targets, a, b, settings):
    """h [N, d], w [d, V], targets [N], a, b [N] -> (sum(a nll + b logZ^2 / 2), nll, logZ)."""
    return _fused_fwd(h, w, targets, a, b, settings)[0]


def _fused_fwd(h, w, targets, a, b, settings):
    logits = _dot(h, w, ((1,), (0,)))  # [N, V] in the compute dtype
    nll, logz, d = softmax_xent(logits, targets, a, b, settings=settings)
    dh = _dot(d, w, ((1,), (1,)))  # [N, d]
    dw = _dot(h, d, ((0,), (0,)))  # [d, V]
    total = jnp.sum(a * nll) + 0.5 * jnp.sum(b * logz * logz)
    return (total, nll, logz), (dh, dw, nll, logz)


def _fused_bwd(settings, res, cts):
    dh, dw, nll, logz = res
    g = cts[0]  # nll's and logZ's cotangents are zero (stop_gradient above)
    return (
        (g * dh).astype(dh.dtype),
        (g * dw).astype(dw.dtype),
        None,
        g * nll,
        0.5 * g * logz * logz,
    )


_fused.defvjp(_fused_fwd, _fused_bwd)
