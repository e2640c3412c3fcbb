"""Evaluation: RULER-style NIAH, MQAR, perplexity by position, zero-shot commonsense."""

from hwh_jax.eval.suite import SUITES, EvalSpec, compare, run_suite

__all__ = ["EvalSpec", "SUITES", "compare", "run_suite"]
