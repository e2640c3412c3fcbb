"""Loss, the jitted train step (with gradient accumulation and non-finite guard) and eval step.

The train state is a plain dict {params, opt_state, step, rng, bad_step} of arrays, so that
Orbax saves it and shardings map onto it directly; the model is rebuilt inside the step from
its graph definition (``nnx.merge``), which costs nothing at run time.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from hwh_jax.training.head_loss import head_loss
from kernels_pallas.cross_entropy.reference import xent_grad, xent_stats


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
    zl = z_loss * ((logz ** 2) * mask).sum() / count if z_loss else 0.0
    return loss, zl, mask.sum()


def model_loss(graphdef, params, batch, *, z_loss=0.0, document_mask=False,
               logits_dtype=jnp.float32):
    """``logits_dtype`` None: the logits stay in the compute dtype (training: the LM head's
    output is the step's largest tensor, and token_nll upcasts inside its own passes), and a
    model whose ``loss_impl`` is not "unfused" takes the head and loss as one op
    (``head_loss``); the evaluation keeps fp32 logits."""
    model = nnx.merge(graphdef, params)
    seg = batch["segment_ids"] if document_mask else None
    pos = batch["positions"] if document_mask else None
    h = model.hidden(batch["inputs"], pos, seg)
    if logits_dtype is None and model.cfg.loss_impl != "unfused":
        total, loss, _, count = head_loss(h, model.head_weight(), batch["targets"],
                                          batch["loss_mask"], z_loss=z_loss,
                                          impl=model.cfg.loss_impl)
        return total, (loss, count)
    logits = model.logits(h, dtype=logits_dtype)
    loss, zl, count = cross_entropy(logits, batch["targets"], batch["loss_mask"], z_loss)
    return loss + zl, (loss, count)


def _split_micro(batch, n):
    return jax.tree.map(lambda x: x.reshape(n, x.shape[0] // n, *x.shape[1:]), batch)


def make_train_step(graphdef, tx, schedule, *, grad_accum=1, z_loss=0.0, document_mask=False):
    """train_step(state, batch) -> (state, metrics); batch leading dim = global batch."""
    loss_fn = functools.partial(model_loss, graphdef, z_loss=z_loss, document_mask=document_mask,
                                logits_dtype=None)
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

    def train_step(state, batch):
        params = state["params"]
        if grad_accum == 1:
            (_, (loss, count)), grads = grad_fn(params, batch)
        else:
            def micro(carry, mb):
                g_sum, l_sum, n_sum = carry
                (_, (l, n)), g = grad_fn(params, mb)
                g_sum = jax.tree.map(lambda a, b: a + b * n, g_sum, g)
                return (g_sum, l_sum + l * n, n_sum + n), None
            zeros = jax.tree.map(jnp.zeros_like, params)
            (g_sum, l_sum, count), _ = jax.lax.scan(
                micro, (zeros, 0.0, 0.0), _split_micro(batch, grad_accum))
            grads = jax.tree.map(lambda g: g / jnp.maximum(count, 1.0), g_sum)
            loss = l_sum / jnp.maximum(count, 1.0)
        gnorm = optax.tree.norm(grads)
        updates, opt_state = tx.update(grads, state["opt_state"], params)
        new_params = optax.apply_updates(params, updates)
        ok = jnp.isfinite(loss) & jnp.isfinite(gnorm)
        # A non-finite step changes nothing and is remembered; the host stops at its next check.
        keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(ok, a, b), new, old)  # noqa
        step = state["step"]
        new_state = {
            "params": keep(new_params, params),
            "opt_state": keep(opt_state, state["opt_state"]),
            "step": step + 1,
            "rng": state["rng"],
            "bad_step": jnp.where(ok | (state["bad_step"] >= 0), state["bad_step"], step),
        }
        metrics = {"loss": loss, "grad_norm": gnorm, "lr": schedule(step), "tokens": count}
        return new_state, metrics

    return train_step


def make_eval_step(graphdef, *, document_mask=False):
    def eval_step(params, batch):
        _, (loss, count) = model_loss(graphdef, params, batch, document_mask=document_mask)
        return loss * count, count
    return eval_step
