"""The MQAR sweep's sequences: each step's training batch (the settings mixed, or Zoology's fixed
training set in epochs) and the validation and test sets, all from seeds."""

from __future__ import annotations

import functools

import numpy as np

from hwh_jax.eval.mqar import IGNORE, multiquery_ar
from hwh_jax.experiments.mqar.spec import SweepSpec


def _setting_rows(spec: SweepSpec, i: int, n: int, seed: int):
    """``n`` rows of setting ``i`` at its own length: inputs [n, T_i], and each row's query
    positions and answers [n, pairs_i] (int32)."""
    length, pairs = spec.settings[i]
    noise = spec.mode != "zoology"  # Zoology's Figure 2: zeros between the queries
    b = multiquery_ar(spec.vocab, n, length, pairs, random_non_queries=noise, seed=seed * 1009 + i)
    rows, where = np.nonzero(b.labels != IGNORE)  # row-major: each row's in order
    if len(rows) != n * pairs:
        raise AssertionError(
            f"MQAR rows of {pairs} pairs hold {len(rows)} queries, not {n * pairs}"
        )
    where = where.reshape(n, pairs).astype(np.int32)
    return b.inputs, where, np.take_along_axis(b.labels, where, axis=1)


def train_batch(spec: SweepSpec, step: int, data_seed: int = 0) -> tuple:
    """Step ``step``'s batch: the settings mixed evenly (the remainder to the first ones), one
    (inputs, where, answers) group per setting at its own length, so no row is padded (Zoology pads
    every row to the longest; a causal model's predictions before a row's end do not depend on
    the padding after it, so the loss is the same, at about half the tokens). With
    ``train_examples`` (Zoology mode, one setting): the next ``batch_size`` rows of the fixed
    training set in this epoch's order."""
    if spec.train_examples:
        inputs, where, answers = _training_set(spec, data_seed)
        per_epoch = spec.train_examples // spec.batch_size
        epoch, k = divmod(step, per_epoch)
        order = _epoch_order(spec.train_examples, data_seed, epoch)
        rows = order[k * spec.batch_size : (k + 1) * spec.batch_size]
        return ((inputs[rows], where[rows], answers[rows]),)
    k, r = divmod(spec.batch_size, len(spec.settings))
    seed = 1_000_000 * (data_seed + 1) + step
    return tuple(
        _setting_rows(spec, i, k + (i < r), seed) for i in range(len(spec.settings)) if k + (i < r)
    )


@functools.lru_cache(maxsize=2)
def _epoch_order(n: int, data_seed: int, epoch: int) -> np.ndarray:
    """The order of the fixed training set in ``epoch`` (drawn once an epoch, not a step)."""
    return np.random.default_rng((data_seed, epoch)).permutation(n)


@functools.lru_cache(maxsize=2)
def _training_set(spec: SweepSpec, data_seed: int):
    """Zoology mode: the fixed training examples of the spec's one setting."""
    return _setting_rows(spec, 0, spec.train_examples, 3 + data_seed)


def eval_set(spec: SweepSpec, split: str) -> tuple:
    """The validation or test sequences: ``eval_examples`` of every setting, a group each."""
    seed = {"validation": 1, "test": 2}[split]  # training batches use seeds >= 1,000,000
    return tuple(
        _setting_rows(spec, i, spec.eval_examples, seed) for i in range(len(spec.settings))
    )
