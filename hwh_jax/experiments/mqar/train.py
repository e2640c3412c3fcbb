"""One cell of the MQAR sweep trained: every (seed, learning rate) trial of an architecture and
width as one vmapped program (``run_cell``), scored on the validation and test sets, its
trials saved on a signal (``Stopped``) and continued from that file."""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from hwh_jax import storage
from hwh_jax.experiments.mqar.data import eval_set, train_batch
from hwh_jax.experiments.mqar.spec import SweepSpec, sweep_config
from hwh_jax.layers.config import ModelConfig
from hwh_jax.layers.loss import token_nll
from hwh_jax.models.lm import HybridLM
from hwh_jax.models.params import count_params
from hwh_jax.training.optimizer import OptimizerSpec, make_optimizer
from hwh_jax.training.state import init_train_state


def _trial_steps(cfg: ModelConfig, spec: SweepSpec):
    """(init(seeds) -> states, step(states, lrs, groups) -> (states, losses), hits(states,
    inputs, where, answers) -> [trials, N] correct queries a row): every function over a leading
    trial axis; ``groups`` a tuple of (inputs, where, answers) of any lengths, the loss the mean
    over all their queries."""
    zoology = spec.mode == "zoology"  # torch's AdamW defaults, a cosine to 0
    opt = OptimizerSpec(
        lr=1.0,
        min_lr_ratio=0.0 if zoology else 0.1,
        warmup_steps=spec.warmup_steps,
        total_steps=spec.steps,
        weight_decay=spec.weight_decay,
        **(dict(b2=0.999, clip_norm=0.0) if zoology else {}),
    )
    tx, schedule = make_optimizer(opt)  # unit peak: each trial scales by its own lr
    graphdef, _ = nnx.split(nnx.eval_shape(lambda: HybridLM(cfg, rngs=nnx.Rngs(0))), nnx.Param)

    def init(seed):
        s = init_train_state(cfg, tx, seed)
        return {"params": s["params"], "opt_state": s["opt_state"]}

    def at_queries(model, x, where):
        """Hidden states at the query positions only: the LM head, most of a small model's
        work, runs on them and not on every position."""
        return jnp.take_along_axis(model.hidden(x), where[..., None], axis=1)

    def loss_fn(params, groups):
        model = nnx.merge(graphdef, params)
        total, count = 0.0, 0
        for x, where, answers in groups:
            nll, _ = token_nll(model.logits(at_queries(model, x, where), dtype=None), answers)
            total, count = total + nll.sum(), count + answers.size
        return total / count

    def step(state, lr, groups):
        loss, grads = jax.value_and_grad(loss_fn)(state["params"], groups)
        updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
        updates = jax.tree.map(lambda u: u * lr, updates)
        return {
            "params": optax.apply_updates(state["params"], updates),
            "opt_state": opt_state,
        }, loss

    def hits(state, x, where, answers):
        model = nnx.merge(graphdef, state["params"])
        pred = jnp.argmax(model.logits(at_queries(model, x, where), dtype=jnp.float32), -1)
        return (pred == answers).sum(-1)

    return (
        jax.jit(jax.vmap(init)),
        jax.jit(jax.vmap(step, in_axes=(0, 0, None)), donate_argnums=0),
        jax.jit(jax.vmap(hits, in_axes=(0, None, None, None))),
        schedule,
    )


def _score(hits_fn, states, groups, spec, batch):
    """Correct queries per (trial, setting) and queries per setting."""
    right = np.zeros((len(spec.seeds) * len(spec.lrs), len(spec.settings)), np.int64)
    for s, group in enumerate(groups):
        for i in range(0, len(group[0]), batch):
            right[:, s] += np.asarray(hits_fn(states, *(a[i : i + batch] for a in group))).sum(-1)
    return right, np.array([g[2].size for g in groups])


class Stopped(Exception):
    """A signal stopped the sweep inside a cell; its trials' state is saved to continue."""


def _save_partial(path: storage.PathLike, states, step: int, seconds: float):
    """The trials' parameters and optimizer states after ``step`` steps, written atomically
    (floats narrower than fp32 stored as fp32: exact)."""
    leaves = [
        np.asarray(
            x.astype(jnp.float32)
            if jnp.issubdtype(x.dtype, jnp.floating) and x.dtype.itemsize < 4
            else x
        )
        for x in jax.tree.leaves(states)
    ]
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        np.savez(f, step=step, seconds=seconds, **{f"leaf{i}": x for i, x in enumerate(leaves)})
    tmp.replace(path)


def _load_partial(path: storage.PathLike, states):
    """(states, step, seconds) from ``_save_partial``'s file, every leaf checked against the
    freshly initialised ``states`` (another spec's file is an error naming it)."""
    with np.load(path) as f:
        leaves, tree = jax.tree.flatten(states)
        saved = (
            [f[f"leaf{i}"] for i in range(len(leaves))] if len(f.files) == len(leaves) + 2 else None
        )
        if saved is None or any(x.shape != y.shape for x, y in zip(saved, leaves)):
            raise ValueError(
                f"{path} holds the trials of another sweep spec; delete it or use another --out"
            )
        restored = [jnp.asarray(x).astype(y.dtype) for x, y in zip(saved, leaves)]
        return jax.tree.unflatten(tree, restored), int(f["step"]), float(f["seconds"])


def run_cell(
    arch: str,
    width: int,
    spec: SweepSpec,
    log=print,
    partial: storage.PathLike | None = None,
    save_every: int = 1000,
    stop=None,
) -> dict:
    """Train every (seed, lr) trial of ``arch`` at ``width`` as one program; score them.
    ``partial``: a file the trials' state is saved to every ``save_every`` steps and when
    ``stop.signal`` is set (then ``Stopped`` is raised), and continued from when it exists
    (the batches depend on the step only, so a continued cell trains as an uninterrupted one)."""
    cfg = sweep_config(arch, width, spec)
    init, step, hits, _ = _trial_steps(cfg, spec)
    trials = [(s, lr) for s in spec.seeds for lr in spec.lrs]
    states = init(jnp.asarray([s for s, _ in trials], jnp.int32))
    lrs = jnp.asarray([lr for _, lr in trials], jnp.float32)
    start, before = 0, 0.0
    if partial is not None and partial.exists():
        states, start, before = _load_partial(partial, states)
        log(f"  {arch} d={width}: continuing from step {start} ({partial.name})")
    t0, losses = time.time() - before, None
    every = max(spec.steps // 4, 1)
    for t in range(start, spec.steps):
        states, losses = step(states, lrs, train_batch(spec, t))
        done = t + 1
        if stop is not None and stop.signal and done < spec.steps:
            _save_partial(partial, states, done, time.time() - t0)
            raise Stopped(
                f"stopped by {stop.signal} at step {done}/{spec.steps} of {arch} "
                f"d={width}; its trials are saved in {partial}: the same command "
                f"continues the sweep"
            )
        if partial is not None and done % save_every == 0 and done < spec.steps:
            _save_partial(partial, states, done, time.time() - t0)
        if done % every == 0 or done == spec.steps:
            loss = np.asarray(losses)
            log(
                f"  {arch} d={width}: step {done}/{spec.steps}, loss "
                f"{loss.min():.3f}-{loss.max():.3f} over {len(trials)} trials "
                f"({time.time() - t0:.0f}s)"
            )
    if losses is None:
        raise ValueError(f"{partial} is at step {start}, not before the sweep's {spec.steps}")
    if not np.all(np.isfinite(np.asarray(losses))):
        log(f"  {arch} d={width}: a non-finite loss in some trial (its scores are what they are)")
    batch = max(spec.batch_size, 1)
    val, _ = _score(hits, states, eval_set(spec, "validation"), spec, batch)
    test, queries = _score(hits, states, eval_set(spec, "test"), spec, batch)
    rows = []
    for si, seed in enumerate(spec.seeds):
        idx = [si * len(spec.lrs) + li for li in range(len(spec.lrs))]
        best = max(idx, key=lambda i: val[i].sum())
        for s, (length, pairs) in enumerate(spec.settings):
            rows.append(
                {
                    "arch": arch,
                    "width": width,
                    "seq_len": length,
                    "pairs": pairs,
                    "seed": seed,
                    "lr": trials[best][1],
                    "right": int(test[best, s]),
                    "queries": int(queries[s]),
                    "accuracy": float(test[best, s] / queries[s]),
                    "final_loss": float(np.asarray(losses)[best]),
                }
            )
    return {
        "arch": arch,
        "width": width,
        "params": int(count_params(cfg)),
        "rows": rows,
        "seconds": time.time() - t0,
    }
