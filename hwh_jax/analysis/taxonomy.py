"""Head taxonomy (retrieval vs positional) and the Global Positional Band from RFIS / RPD.

Definitions used here (the paper describes the phenomenon; these make it a computation):

* **GPBand**: over all analysed heads, the mean RPD profile over frequencies says how much
  attention the rotation itself decides at each frequency. On trained RoPE models it is large
  at high frequencies and falls to ~0 at periods somewhat longer than the training length. The
  band is the falling edge: from the first frequency (going towards long periods) where the
  profile drops below ``upper`` (50%) of its maximum, to the last frequency where it is still
  at least ``lower`` (10%) of it. It is reported as frequency indices and as rotation periods
  2 pi / w_r against the training length; frequencies past it barely rotate within the context
  and act as position-free channels.
* **Retrieval score** of a head: the share of its RFIS mass at frequencies *below* the band
  (periods longer than the band's), i.e. what it reads from nearly rotation-free channels. A
  head is a retrieval head when the score is at least ``threshold`` (default 0.5), else a
  positional head (positional score = 1 - retrieval score).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np


@dataclasses.dataclass
class Band:
    """A band of RoPE frequency indices [lo, hi] (the GPBand), its peak and the rotation periods
    at its ends, in tokens and, given the training length, as a share of it."""

    lo: int  # first frequency index of the band (higher frequency end)
    hi: int  # last frequency index (lower frequency end), inclusive
    peak: int
    periods: tuple[float, float]  # rotation periods at lo and hi, tokens
    train_len: int | None

    def as_dict(self):
        d = dataclasses.asdict(self)
        if self.train_len:
            d["periods_over_train_len"] = [p / self.train_len for p in self.periods]
        return d


def rotation_periods(frequencies) -> np.ndarray:
    return 2 * math.pi / np.asarray(frequencies, np.float64)


def gpband(
    rpd_layers, frequencies, *, train_len: int | None = None, upper: float = 0.5, lower: float = 0.1
) -> Band:
    """Band from RPD [H, F] arrays (one per layer, any head counts)."""
    profile = np.concatenate([np.asarray(r, np.float64) for r in rpd_layers], 0).mean(0)
    peak = int(np.argmax(profile))
    top = profile[peak]
    above = np.nonzero(profile >= lower * top)[0]
    hi = int(above.max())
    strong = np.nonzero(profile[: hi + 1] >= upper * top)[0]
    lo = min(int(strong.max()) + 1, hi)
    periods = rotation_periods(frequencies)
    return Band(lo, hi, peak, (float(periods[lo]), float(periods[hi])), train_len)


def classify_heads(rfis, band: Band, *, threshold: float = 0.5) -> list[dict]:
    """Per head of one layer: {head, kind, retrieval_score, positional_score}."""
    rfis = np.asarray(rfis, np.float64)
    total = rfis.sum(1) + 1e-12
    score = rfis[:, band.hi + 1 :].sum(1) / total
    return [
        {
            "head": h,
            "kind": "retrieval" if s >= threshold else "positional",
            "retrieval_score": float(s),
            "positional_score": float(1 - s),
        }
        for h, s in enumerate(score)
    ]


def retrieval_counts(taxonomy_layers) -> list[int]:
    """Retrieval heads per layer: the FA allocation an ``hwh`` config takes (model.counts)."""
    return [sum(h["kind"] == "retrieval" for h in layer) for layer in taxonomy_layers]
