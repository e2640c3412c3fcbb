"""Intervals for the evaluation's accuracies: Wilson's score interval for a share of n prompts
answered right (exact enough at any n, never outside [0, 1], unlike the normal approximation
at 0 or n correct), a percentile bootstrap for a mean over seeds or runs, and, where the seed
(one trained model) is the unit, the t interval of the mean over seeds and the exact rank
test of one configuration's seeds all above another's.

Which unit: a share of prompts with its Wilson interval describes one trained model; a
comparison of architectures is a comparison of training runs, so its unit is the seed, and
with three seeds a side its t interval is wide (t = 4.30) and the smallest rank-test p is
1/20."""

from __future__ import annotations

import math

import numpy as np

Z95 = 1.959963984540054


def wilson(correct: float, n: int, z: float = Z95) -> tuple[float, float]:
    """95% (default ``z``) Wilson score interval of the share ``correct / n``, as fractions."""
    if n <= 0:
        return (float("nan"), float("nan"))
    if correct <= 0:  # the bounds the formula reaches up to rounding (5.6e-15)
        return (0.0, wilson_upper_at_zero(n, z))
    if correct >= n:
        return (1.0 - wilson_upper_at_zero(n, z), 1.0)
    p = correct / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def wilson_upper_at_zero(n: int, z: float = Z95) -> float:
    """The Wilson interval's upper bound for 0 right of ``n``: z^2 / (n + z^2)."""
    return z * z / (n + z * z)


def seeds_interval(values, level: float = 0.95) -> tuple[float, float] | None:
    """The t interval of the mean of ``values`` (one per seed): mean +- t(n - 1) sd / sqrt(n);
    None for fewer than two seeds."""
    from scipy import stats as scipy_stats

    n = len(values)
    if n < 2:
        return None
    mean, sd = float(np.mean(values)), float(np.std(values, ddof=1))
    half = float(scipy_stats.t.ppf(0.5 + level / 2, n - 1)) * sd / math.sqrt(n)
    return (mean - half, mean + half)


def all_above_p(higher, lower) -> float:
    """Exact one-sided p that every value of ``higher`` exceeds every value of ``lower`` when
    the seeds are exchangeable (the Mann-Whitney U at its extreme): 1 / C(n + m, n); 1.0 when
    some value of ``higher`` is not above every value of ``lower``."""
    if not higher or not lower or min(higher) <= max(lower):
        return 1.0
    return 1.0 / math.comb(len(higher) + len(lower), len(higher))


def share(scores: list[float]) -> dict:
    """A cell's NIAH / accuracy summary from per-prompt scores in [0, 100] (100 = right):
    n, how many right (a score of 100), the mean score, and the Wilson interval of the share
    right, in percent."""
    n = len(scores)
    right = sum(1 for s in scores if s >= 100.0)
    lo, hi = wilson(right, n)
    return {
        "n": n,
        "right": right,
        "mean": float(np.mean(scores)) if n else float("nan"),
        "lo": 100 * lo,
        "hi": 100 * hi,
    }


def bootstrap_mean(
    values, *, samples: int = 10_000, level: float = 0.95, seed: int = 0
) -> tuple[float, float, float]:
    """(mean, lo, hi): the mean of ``values`` and its percentile bootstrap interval."""
    x = np.asarray(values, np.float64)
    if x.size == 0:
        return (float("nan"),) * 3
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, size=(samples, x.size))].mean(axis=1)
    a = (1 - level) / 2
    return float(x.mean()), float(np.quantile(means, a)), float(np.quantile(means, 1 - a))


def fmt_share(cell: dict) -> str:
    """ "40 [25-56] n=40": the mean score, the interval of the share right, n."""
    return f"{cell['mean']:.0f} [{cell['lo']:.0f}-{cell['hi']:.0f}] n={cell['n']}"
