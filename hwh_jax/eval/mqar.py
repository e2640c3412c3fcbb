"""Multi-query associative recall (MQAR; Arora et al., 2023, "Zoology"), as Zoology builds it.

A sequence opens with ``num_kv_pairs`` key-value pairs (keys from [1, vocab/2), values from
[vocab/2, vocab), no repeats within a sequence), then the keys recur as queries at gaps drawn
from a power law (p(gap = i) ~ i^(a-1), a = ``power_a``); the target at each query is its value,
and every other position is ignored (label -100). Positions between queries hold random tokens
(``random_non_queries``). Inputs/labels are the sequence shifted by one, as in Zoology.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from hwh_jax.progress import Progress

IGNORE = -100


@dataclasses.dataclass
class MqarBatch:
    """MQAR sequences and their labels: the value token at each query position, IGNORE
    elsewhere."""

    inputs: np.ndarray  # [N, T] int32
    labels: np.ndarray  # [N, T] int32, IGNORE except at query positions


def multiquery_ar(
    vocab_size: int,
    num_examples: int,
    input_seq_len: int,
    num_kv_pairs: int,
    *,
    power_a: float = 0.01,
    random_non_queries: bool = True,
    seed: int = 0,
) -> MqarBatch:
    if input_seq_len % 2:
        raise ValueError(f"MQAR input_seq_len must be even, got {input_seq_len}")
    if vocab_size <= input_seq_len:
        raise ValueError(f"MQAR vocab_size {vocab_size} must exceed input_seq_len {input_seq_len}")
    context = num_kv_pairs * 2
    if context >= input_seq_len or num_kv_pairs * 4 > input_seq_len:
        raise ValueError(
            f"MQAR: {num_kv_pairs} pairs need input_seq_len >= {num_kv_pairs * 4}, "
            f"got {input_seq_len}"
        )
    half = vocab_size // 2
    if num_kv_pairs > half - 1:
        raise ValueError(
            f"MQAR: {num_kv_pairs} distinct keys do not fit in a vocabulary of {vocab_size}"
        )
    rng = np.random.default_rng(seed)
    keys = np.stack(
        [rng.choice(np.arange(1, half), num_kv_pairs, replace=False) for _ in range(num_examples)]
    )
    values = np.stack(
        [
            rng.choice(np.arange(half, vocab_size), num_kv_pairs, replace=False)
            for _ in range(num_examples)
        ]
    )
    kvs = np.zeros((num_examples, context), np.int64)
    kvs[:, 0::2], kvs[:, 1::2] = keys, values
    space = (input_seq_len - context) // 2
    p = power_a * np.arange(1, space + 1) ** (power_a - 1)
    p /= p.sum()
    gaps = np.stack(
        [rng.choice(space, num_kv_pairs, replace=False, p=p) for _ in range(num_examples)]
    )
    queries = np.zeros((num_examples, input_seq_len - context + 1), np.int64)
    np.put_along_axis(queries, gaps * 2, keys, axis=1)
    examples = np.concatenate([kvs, queries], axis=1)
    labels = np.full((num_examples, input_seq_len + 1), IGNORE, np.int64)
    np.put_along_axis(labels, gaps * 2 + context + 1, values, axis=1)
    inputs, labels = examples[:, :-1], labels[:, 1:]
    if random_non_queries:
        noise = rng.integers(0, vocab_size, inputs.shape)
        inputs = np.where(inputs == 0, noise, inputs)
    return MqarBatch(inputs.astype(np.int32), labels.astype(np.int32))


def mqar_accuracy(logits: np.ndarray, labels: np.ndarray) -> float:
    """Share of query positions whose argmax is the value (Zoology's accuracy)."""
    mask = labels != IGNORE
    if not mask.any():
        raise ValueError("MQAR labels hold no query position")
    return float((np.argmax(logits, -1) == labels)[mask].mean())


def evaluate_mqar(
    scorer, *, vocab_size: int, settings, num_examples: int = 64, seed: int = 0, log=print
):
    """Accuracy per (input_seq_len, num_kv_pairs) in ``settings`` with a Scorer's model."""
    rows = []
    progress = Progress(len(settings) * num_examples, "mqar", unit="example")
    for seq_len, pairs in settings:
        b = multiquery_ar(vocab_size, num_examples, seq_len, pairs, seed=seed)
        hits = total = 0
        for i in range(0, num_examples, scorer.batch_size):
            pred = scorer.argmax(b.inputs[i : i + scorer.batch_size])
            y = b.labels[i : i + scorer.batch_size]
            mask = y != IGNORE
            hits, total = hits + int((pred == y)[mask].sum()), total + int(mask.sum())
            progress.update(len(y))
        rows.append(
            {
                "seq_len": seq_len,
                "num_kv_pairs": pairs,
                "accuracy": hits / total,
                "examples": num_examples,
            }
        )
        log(f"mqar seq {seq_len} pairs {pairs}: accuracy {hits / total:.3f}")
    progress.close()
    return rows
