"""Small statistics helpers shared by every runner (no numpy needed)."""

from __future__ import annotations

import math
from typing import Sequence


def percentile(xs: Sequence[float], q: float) -> float:
    """q-th percentile (0..100) by linear interpolation between order statistics.

    The same definition as numpy's default ("linear"): rank = q/100 × (n − 1).
    """
    if not xs:
        raise ValueError("percentile of an empty sample")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q must be in [0, 100], got {q}")
    s = sorted(xs)
    rank = q / 100 * (len(s) - 1)
    lo = math.floor(rank)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (rank - lo)


def median(xs: Sequence[float]) -> float:
    return percentile(xs, 50)


def mean(xs: Sequence[float]) -> float:
    if not xs:
        raise ValueError("mean of an empty sample")
    return sum(xs) / len(xs)
