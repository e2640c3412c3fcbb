"""The jitted train step (with gradient accumulation and a non-finite guard) and eval step.

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

from hwh_jax.layers.loss import LOSS_IMPLS, cross_entropy, head_loss
from kernels_pallas import SoftmaxXentSettings


def _hidden(model, batch, document_mask):
    seg = batch["segment_ids"] if document_mask else None
    pos = batch["positions"] if document_mask else None
    return model.hidden(batch["inputs"], pos, seg)


def train_loss(graphdef, params, batch, *, loss_impl: str = "auto", z_loss: float = 0.0,
               document_mask: bool = False):
    """(loss + z-loss, (mean masked nll, tokens)) of a batch, as the training step takes it.

    ``loss_impl``: "unfused" takes the logits in the compute dtype (the step's largest tensor;
    ``token_nll`` upcasts inside its own passes) and autodiff through them; any other value is
    the ``softmax_xent`` kernel's impl for ``head_loss``, the LM head and loss as one op."""
    if loss_impl not in LOSS_IMPLS:
        raise ValueError(f"train.loss_impl must be one of {LOSS_IMPLS}, got {loss_impl!r}")
    model = nnx.merge(graphdef, params)
    h = _hidden(model, batch, document_mask)
    if loss_impl == "unfused":
        logits = model.logits(h, dtype=None)
        loss, zl, count = cross_entropy(logits, batch["targets"], batch["loss_mask"], z_loss)
        return loss + zl, (loss, count)
    settings = SoftmaxXentSettings(impl=loss_impl, platform=model.cfg.kernel_platform or None)
    total, loss, _, count = head_loss(h, model.head_weight(), batch["targets"],
                                      batch["loss_mask"], z_loss=z_loss, settings=settings)
    return total, (loss, count)


def eval_loss(graphdef, params, batch, *, document_mask: bool = False):
    """(mean masked nll, tokens) of a batch from fp32 logits (the held-out evaluation)."""
    model = nnx.merge(graphdef, params)
    logits = model.logits(_hidden(model, batch, document_mask), dtype=jnp.float32)
    loss, _, count = cross_entropy(logits, batch["targets"], batch["loss_mask"])
    return loss, count


def _split_micro(batch, n):
    """[B, ...] -> [n, B / n, ...], micro-batch j = rows j, j + n, j + 2n, ...: each device's
    rows of the batch (a contiguous block of them) split evenly over the micro-batches, so
    every micro-batch is spread over all data-parallel devices without moving a row."""
    return jax.tree.map(lambda x: x.reshape(x.shape[0] // n, n, *x.shape[1:]).swapaxes(0, 1),
                        batch)


def _pad_rows(batch, rows, shards):
    """[B, ...] -> [rows, ...]: each of the ``shards`` contiguous blocks of the batch (one per
    data-parallel device) padded at its end with zero rows (loss mask 0: they add nothing to
    the loss, the token count or the gradients), so no row moves between devices."""
    def pad(x):
        b = x.shape[0]
        x = x.reshape(shards, b // shards, *x.shape[1:])
        x = jnp.pad(x, [(0, 0), (0, (rows - b) // shards)] + [(0, 0)] * (x.ndim - 2))
        return x.reshape(rows, *x.shape[2:])
    return jax.tree.map(pad, batch)


def make_train_step(graphdef, tx, schedule, *, grad_accum=1, micro_batch=None, shards=1,
                    z_loss=0.0, document_mask=False, loss_impl: str = "auto"):
    """train_step(state, batch) -> (state, metrics); batch leading dim = global batch B, run as
    ``grad_accum`` micro-batches of ``micro_batch`` rows (default B / grad_accum) whose
    gradients are summed weighted by their tokens: the update equals the whole batch's. When
    grad_accum x micro_batch exceeds B, each of the ``shards`` data-parallel blocks of the
    batch is padded with masked rows to fill the last micro-batches (``memory.plan`` chooses
    such a split when the largest micro-batch that fits does not divide B). ``loss_impl``,
    ``z_loss``, ``document_mask``: see ``train_loss``."""
    loss_fn = functools.partial(train_loss, graphdef, loss_impl=loss_impl, z_loss=z_loss,
                                document_mask=document_mask)
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

    def train_step(state, batch):
        params = state["params"]
        if grad_accum == 1:
            (_, (loss, count)), grads = grad_fn(params, batch)
        else:
            rows = jax.tree.leaves(batch)[0].shape[0]
            padded = grad_accum * (micro_batch or rows // grad_accum)
            if padded < rows or (padded - rows) % shards:
                raise ValueError(f"{grad_accum} micro-batches of {micro_batch} rows cannot hold "
                                 f"a batch of {rows} over {shards} data-parallel shards")
            if padded > rows:
                batch = _pad_rows(batch, padded, shards)

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
    """eval_step(params, batch) -> (summed nll, tokens)."""
    def eval_step(params, batch):
        loss, count = eval_loss(graphdef, params, batch, document_mask=document_mask)
        return loss * count, count
    return eval_step
