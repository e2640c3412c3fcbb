"""Softmax cross entropy of logit rows together with the logits' gradient.

    softmax_xent(logits, targets, a, b) -> (nll, logZ, d)
    d = softmax(logits) * (a + b logZ) - a * onehot(targets)    (``reference.py``)

d is the gradient of sum(a * nll + b * logZ^2 / 2): the training loss computes it in its
forward pass (``hwh_jax.training.head_loss``), so the logits are read by one kernel instead of
three XLA passes. The op itself is not differentiable.

Implementations:
  reference  ``reference.py``: jnp (the specification; TPU, CPU).
  pallas     ``pallas.py``: one Triton kernel; GPU, or ``interpret=True``.
``impl="auto"`` picks per backend (``AUTO_IMPL``), and the reference where the kernel cannot run
(a vocabulary that is not a multiple of ``MIN_WIDTH``, or one sharded over a mesh axis).
"""
from __future__ import annotations

from kernels_pallas import dispatch, sharding
from kernels_pallas.cross_entropy.pallas import MIN_WIDTH, softmax_xent_pallas
from kernels_pallas.cross_entropy.reference import softmax_xent_reference

IMPLS = ("auto", "reference", "pallas")
AUTO_IMPL = {"gpu": "pallas"}


def resolve_impl(impl: str = "auto", vocab: int | None = None) -> str:
    """The implementation ``softmax_xent(impl=impl)`` runs on this backend for ``vocab``
    columns under the current ``kernel_mesh``."""
    dispatch.check_impl("softmax_xent", impl, IMPLS)
    if impl != "auto":
        return impl
    choice = AUTO_IMPL.get(dispatch.backend(), "reference")
    km = sharding.current()
    if choice == "pallas" and ((vocab is not None and vocab % MIN_WIDTH) or
                               (km is not None and km.head_spec(vocab or 1) is not None)):
        return "reference"        # rows the kernel cannot cover, or a vocabulary split over devices
    return choice


def softmax_xent(logits, targets, a, b, *, impl: str = "auto", interpret=False, **kernel):
    """logits [N, V], targets [N] int, a, b [N] -> (nll [N] fp32, logZ [N] fp32, d [N, V] in the
    logits' dtype). ``kernel``: ``softmax_xent_pallas``'s block_v, num_warps, num_stages."""
    if logits.ndim != 2 or targets.shape != logits.shape[:1]:
        raise ValueError(f"softmax_xent: logits [N, V] and targets [N], got {logits.shape} and "
                         f"{targets.shape}")
    for name, w in (("a", a), ("b", b)):
        if w.shape != targets.shape:
            raise ValueError(f"softmax_xent: {name} must be [{targets.shape[0]}], got {w.shape}")
    impl = dispatch.record("softmax_xent", resolve_impl(impl, logits.shape[1]))
    if impl == "reference":
        return softmax_xent_reference(logits, targets, a, b)
    fn = lambda l, t, a, b: softmax_xent_pallas(l, t, a, b, interpret=interpret, **kernel)  # noqa
    km = sharding.current()
    if km is None:
        return fn(logits, targets, a, b)
    rows = sharding.P(km.batch_spec(logits.shape[0]))
    full = sharding.P(km.batch_spec(logits.shape[0]), None)
    return sharding.per_shard(fn, km, (full, rows, rows, rows), (rows, rows, full))(
        logits, targets, a, b)


__all__ = ["softmax_xent", "softmax_xent_pallas", "softmax_xent_reference", "resolve_impl",
           "IMPLS", "AUTO_IMPL", "MIN_WIDTH"]
