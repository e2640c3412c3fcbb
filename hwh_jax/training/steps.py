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


def train_loss(
    graphdef,
    params,
    batch,
    *,
    loss_impl: str = "auto",
    z_loss: float = 0.0,
    document_mask: bool = False,
):
    """(loss + z-loss, (mean masked nll, tokens)) of a batch, as the training step takes it.

    ``loss_impl``: "unfused" takes the logits in the compute dtype (the step's largest tensor;
    ``token_nll`` upcasts inside its own passes) and autodiff through them; any other value is
    the ``softmax_xent`` kernel's impl for ``head_loss``, the LM head and loss as one op."""
    if loss_impl not in LOSS_IMPLS:
        raise ValueError(f"train.loss_impl must be one of {LOSS_IMPLS}, got {loss_impl!r}")
    model = nnx.merge(graphdef, params)
    h = _hidden(model, batch, document_mask)
    if loss_impl == "unfused":
        with jax.named_scope("lm_head"):  # the profile's groups (profiling/profile.py)
            logits = model.logits(h, dtype=None)
            loss, zl, count = cross_entropy(logits, batch["targets"], batch["loss_mask"], z_loss)
        return loss + zl, (loss, count)
    settings = SoftmaxXentSettings(impl=loss_impl, platform=model.cfg.kernel_platform or None)
    with jax.named_scope("lm_head"):
        total, loss, _, count = head_loss(
            h,
            model.head_weight(),
            batch["targets"],
            batch["loss_mask"],
            z_loss=z_loss,
            settings=settings,
        )
    return total, (loss, count)


def eval_loss(graphdef, params, batch, *, document_mask: bool = False):
    """(mean masked nll, tokens) of a batch from fp32 logits (the held-out evaluation)."""
    model = nnx.merge(graphdef, params)
    logits = model.logits(_hidden(model, batch, document_mask), dtype=jnp.float32)
    loss, _, count = cross_entropy(logits, batch["targets"], batch["loss_mask"])
    return loss, count


def _split_micro(batch, n, micro, shards):
    """[B, ...] -> ([n, micro, ...] or None, [last, ...] or None): ``n`` micro-batches of
    ``micro`` rows and, when they do not fill B, one last micro-batch of the ``last`` rows left.

    Each of the ``shards`` contiguous blocks of the batch (one per data-parallel device) is split
    on its own, so every micro-batch is spread over all data-parallel devices without moving a
    row: micro-batch j takes rows j, j + n, j + 2n, ... of the first n x micro / shards rows of
    each block, the last micro-batch the rest of each block."""
    rows = jax.tree.leaves(batch)[0].shape[0]
    per, md = rows // shards, micro // shards

    def head(x):
        x = x.reshape(shards, per, *x.shape[1:])[:, : n * md]
        x = x.reshape(shards, md, n, *x.shape[2:]).swapaxes(0, 2).swapaxes(1, 2)
        return x.reshape(n, micro, *x.shape[3:])

    def tail(x):
        x = x.reshape(shards, per, *x.shape[1:])[:, n * md :]
        return x.reshape(rows - n * micro, *x.shape[2:])

    return (
        jax.tree.map(head, batch) if n else None,
        jax.tree.map(tail, batch) if rows > n * micro else None,
    )


def make_train_step(
    graphdef,
    tx,
    schedule,
    *,
    grad_accum=1,
    micro_batch=None,
    shards=1,
    z_loss=0.0,
    document_mask=False,
    loss_impl: str = "auto",
):
    """train_step(state, batch) -> (state, metrics); batch leading dim = global batch B, run as
    ``grad_accum`` micro-batches of ``micro_batch`` rows (default B / grad_accum) whose
    gradients are summed weighted by their tokens: the update equals the whole batch's. When
    ``micro_batch`` does not divide B, the last micro-batch holds the rows left (fewer; a
    program of its own after the loop over the others, so no row is computed that the batch
    does not hold; ``memory.plan`` chooses such a split when the largest micro-batch that fits
    does not divide B). ``shards``: the data-parallel devices, whose blocks of the batch are
    split each on its own (``_split_micro``). ``loss_impl``,
    ``z_loss``, ``document_mask``: see ``train_loss``."""
    loss_fn = functools.partial(
        train_loss, graphdef, loss_impl=loss_impl, z_loss=z_loss, document_mask=document_mask
    )
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

    def train_step(state, batch):
        params = state["params"]
        if grad_accum == 1:
            (_, (loss, count)), grads = grad_fn(params, batch)
        else:
            rows = jax.tree.leaves(batch)[0].shape[0]
            micro_rows = micro_batch or rows // grad_accum
            full = rows // micro_rows  # micro-batches of micro_rows rows
            last = rows - full * micro_rows  # rows of one smaller last micro-batch
            if full + (last > 0) != grad_accum or micro_rows % shards or rows % shards:
                raise ValueError(
                    f"{grad_accum} micro-batches of {micro_rows} rows cannot split "
                    f"a batch of {rows} over {shards} data-parallel shards: they "
                    f"must hold it with at most one smaller last micro-batch"
                )

            def micro(carry, mb):
                g_sum, l_sum, n_sum = carry
                (_, (l, n)), g = grad_fn(params, mb)
                g_sum = jax.tree.map(lambda a, b: a + b * n, g_sum, g)
                return (g_sum, l_sum + l * n, n_sum + n), None

            carry = (jax.tree.map(jnp.zeros_like, params), 0.0, 0.0)
            head, tail = _split_micro(batch, full, micro_rows, shards)
            if head is not None:
                carry, _ = jax.lax.scan(micro, carry, head)
            if tail is not None:
                carry, _ = micro(carry, tail)
            g_sum, l_sum, count = carry
            grads = jax.tree.map(lambda g: g / jnp.maximum(count, 1.0), g_sum)
            loss = l_sum / jnp.maximum(count, 1.0)
        with jax.named_scope("optimizer"):
            gnorm = optax.tree.norm(grads)
            updates, opt_state = tx.update(grads, state["opt_state"], params)
            new_params = optax.apply_updates(params, updates)
        ok = jnp.isfinite(loss) & jnp.isfinite(gnorm)
        # A non-finite step changes nothing and is remembered; the host stops at its next check.
        keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(ok, a, b), new, old)
        step = state["step"]
        new_state = {
            "params": keep(new_params, params),
            "opt_state": keep(opt_state, state["opt_state"]),
            "step": step + 1,
            "rng": state["rng"],
            "bad_step": jnp.where(ok | (state["bad_step"] >= 0), state["bad_step"], step),
        }
        metrics = {
            "loss": loss,
            "grad_norm": gnorm,
            "lr": schedule(step),
            "tokens": count,
            "bad_step": new_state["bad_step"],
        }
        return new_state, metrics

    return train_step


def make_eval_step(graphdef, *, document_mask=False):
    """eval_step(params, batch) -> (summed nll, tokens)."""

    def eval_step(params, batch):
        loss, count = eval_loss(graphdef, params, batch, document_mask=document_mask)
        return loss * count, count

    return eval_step
