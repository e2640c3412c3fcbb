"""``softmax_xent``: the public entry, which checks shapes and runs the implementation its
``SoftmaxXentSettings`` choose; under ``kernel_mesh`` the kernel runs per device shard."""

from __future__ import annotations

from kernels_pallas import dispatch, sharding
from kernels_pallas.softmax_xent.pallas import MIN_WIDTH, softmax_xent_pallas
from kernels_pallas.softmax_xent.reference import softmax_xent_reference
from kernels_pallas.softmax_xent.settings import SoftmaxXentSettings


def choose(settings: SoftmaxXentSettings, vocab: int) -> str:
    """The implementation ``softmax_xent`` runs for ``vocab`` columns under the current
    ``kernel_mesh``."""
    impl = settings.choose()
    if settings.impl != "auto" or impl != "pallas":
        return impl
    km = sharding.current()
    if vocab % MIN_WIDTH or (km is not None and km.head_spec(vocab) is not None):
        return "reference"  # rows the kernel cannot cover, or a vocabulary split over devices
    return impl


def softmax_xent(logits, targets, a, b, *, settings: SoftmaxXentSettings | None = None):
    """logits [N, V], targets [N] int, a, b [N] -> (nll [N] fp32, logZ [N] fp32, d [N, V] in the
    logits' dtype), d = softmax(logits) (a + b logZ) - a onehot(targets), the gradient of
    sum(a nll + b logZ^2 / 2). Not differentiable itself."""
    settings = SoftmaxXentSettings() if settings is None else settings
    if logits.ndim != 2 or targets.shape != logits.shape[:1]:
        raise ValueError(
            f"softmax_xent: logits [N, V] and targets [N], got {logits.shape} and {targets.shape}"
        )
    for name, w in (("a", a), ("b", b)):
        if w.shape != targets.shape:
            raise ValueError(f"softmax_xent: {name} must be [{targets.shape[0]}], got {w.shape}")
    impl = dispatch.record(settings, choose(settings, logits.shape[1]))
    if impl == "reference":
        return softmax_xent_reference(logits, targets, a, b)
    fn = lambda l, t, a, b: softmax_xent_pallas(l, t, a, b, settings=settings)
    km = sharding.current()
    if km is None:
        return fn(logits, targets, a, b)
    rows = sharding.P(km.batch_spec(logits.shape[0]))
    full = sharding.P(km.batch_spec(logits.shape[0]), None)
    return sharding.per_shard(fn, km, (full, rows, rows, rows), (rows, rows, full))(
        logits, targets, a, b
    )
