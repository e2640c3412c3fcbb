"""Checks of numeric config values: finite, of the right kind and in range, with errors that name
the config key, the value and the range (``number("train.lr", nan, lo=0, lo_open=True)`` ->
``ValueError: train.lr must be a finite number > 0, got nan``)."""

from __future__ import annotations

import math


def number(
    key: str,
    value,
    *,
    lo=None,
    hi=None,
    lo_open: bool = False,
    hi_open: bool = False,
    integer: bool = False,
) -> None:
    """Raise ValueError naming ``key`` unless ``value`` is a finite number (an integer if
    ``integer``) in the range [lo, hi] (open at an end where ``*_open``)."""
    kind = "an integer" if integer else "a finite number"
    bounds = []
    if lo is not None:
        bounds.append(f"{'>' if lo_open else '>='} {lo}")
    if hi is not None:
        bounds.append(f"{'<' if hi_open else '<='} {hi}")
    want = f"{key} must be {kind}" + (f" {' and '.join(bounds)}" if bounds else "")
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if ok and integer:
        ok = float(value).is_integer()
    if ok:
        ok = math.isfinite(value)
    if ok and lo is not None:
        ok = value > lo if lo_open else value >= lo
    if ok and hi is not None:
        ok = value < hi if hi_open else value <= hi
    if not ok:
        raise ValueError(f"{want}, got {value!r}")
