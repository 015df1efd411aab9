"""Percentiles and means for every runner: numpy's, with one definition and clear errors.

numpy's default method ("linear": rank = q/100 × (n − 1)) is the definition every
percentile k25exp logs uses; an empty sample is an error here rather than numpy's nan and
RuntimeWarning, so a figure over nothing cannot be logged by accident.
"""

from __future__ import annotations

import re
from typing import Optional, Sequence

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


# A percentile is a figure only over enough samples: p99 of 8 requests is the maximum, not a
# tail estimate. Below these counts it is not logged, and tables say why.
MIN_SAMPLES = {90: 10, 95: 20, 99: 100}


def min_samples(q: float) -> int:
    """Samples a q-th percentile needs to be reported (1 for the median and below p90)."""
    return max((n for p, n in MIN_SAMPLES.items() if q >= p), default=1)


def bootstrap_ci(xs: Sequence[float], stat=np.median, level: float = 0.95, n_boot: int = 2000,
                 seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of stat(xs): resample xs with replacement n_boot times
    (fixed seed, so a run's interval is reproducible)."""
    a = np.asarray(xs, dtype=float)
    if len(a) < 2:
        raise ValueError(f"a bootstrap interval needs at least 2 samples, got {len(a)}")
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(a), size=(n_boot, len(a)))
    vals = stat(a[idx], axis=1)
    lo, hi = np.percentile(vals, [(1 - level) / 2 * 100, (1 + level) / 2 * 100])
    return float(lo), float(hi)


def suppressed(figs: dict, key: str) -> Optional[str]:
    """Why a percentile figure `<name>_p<q>` is absent from figs: 'n<100' when the count
    `<name>_n` beside it was too small; None when it is there or absent for another reason."""
    m = re.fullmatch(r"(.+)_p(\d+)", key)
    if not m or key in figs:
        return None
    n, need = figs.get(f"{m.group(1)}_n"), min_samples(int(m.group(2)))
    return f"n<{need}" if n is not None and n < need else None

