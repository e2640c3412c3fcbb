"""Softmax cross entropy of logit rows together with the logits' gradient.

    softmax_xent(logits, targets, a, b) -> (nll, logZ, d)
    d = softmax(logits) * (a + b logZ) - a * onehot(targets)    (``reference.py``)

d is the gradient of sum(a * nll + b * logZ^2 / 2): the training loss computes it in its
forward pass (``hwh_jax.layers.loss.head_loss``), so the logits are read by one kernel instead
of three XLA passes.

  reference.py  jnp: the specification, and the halves of the unfused loss
  pallas.py     one Triton kernel
  settings.py   ``SoftmaxXentSettings``
  op.py         ``softmax_xent``: shapes checked, the implementation dispatched
"""

from kernels_pallas.softmax_xent.op import softmax_xent
from kernels_pallas.softmax_xent.pallas import MIN_WIDTH, softmax_xent_pallas
from kernels_pallas.softmax_xent.reference import softmax_xent_reference, xent_grad, xent_stats
from kernels_pallas.softmax_xent.settings import SoftmaxXentSettings

__all__ = [
    "MIN_WIDTH",
    "SoftmaxXentSettings",
    "softmax_xent",
    "softmax_xent_pallas",
    "softmax_xent_reference",
    "xent_grad",
    "xent_stats",
]
