"""Percentiles and means for every runner: numpy's, with one definition and clear errors.

numpy's default method ("linear": rank = q/100 × (n − 1)) is the definition every
percentile k25exp logs uses; an empty sample is an error here rather than numpy's nan and
RuntimeWarning, so a figure over nothing cannot be logged by accident.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


def percentile(xs: Sequence[float], q: float) -> float:
    """q-th percentile (0..100), numpy's linear interpolation between order statistics."""
    if len(xs) == 0:
        raise ValueError("percentile of an empty sample")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q must be in [0, 100], got {q}")
    return float(np.percentile(np.asarray(xs, dtype=float), q))


def median(xs: Sequence[float]) -> float:
    return percentile(xs, 50)


def mean(xs: Sequence[float]) -> float:
    if len(xs) == 0:
        raise ValueError("mean of an empty sample")
    return float(np.mean(np.asarray(xs, dtype=float)))
