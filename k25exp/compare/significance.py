"""The tests behind "significant": Mann-Whitney U on the raw samples and a bootstrap interval
of the median's change.

Mann-Whitney U (two-sided, scipy's exact test for small samples without ties, its normal
approximation with tie correction otherwise) asks whether one run's samples tend to be larger
than the other's, without assuming a distribution: latencies are skewed and have tails.
The bootstrap interval says how large the change of the median could be (percent of A's
median), resampling both runs independently with a fixed seed so a compare is repeatable.
One compare tests many figures at once, so p-values are adjusted with Holm's step-down
method (family-wise error at `alpha` over the tests of one compare).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np
from scipy.stats import mannwhitneyu

BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0
MIN_SAMPLES = 3  # fewer on either side: no test (a p-value of 2 vs 2 samples is never < 0.3)


@dataclass(frozen=True)
class Test:
    n_a: int
    n_b: int
    u: float  # U statistic of A
    p: float  # two-sided, before the Holm adjustment
    median_change_pct: float  # (median B − median A) / median A × 100
    ci_low_pct: float  # bootstrap 95 % interval of that change
    ci_high_pct: float


def mann_whitney(a: Sequence[float], b: Sequence[float]) -> tuple[float, float]:
    """(U of a, two-sided p)."""
    r = mannwhitneyu(np.asarray(a, float), np.asarray(b, float), alternative="two-sided",
                     method="auto")
    return float(r.statistic), float(r.pvalue)


def bootstrap_median_change(a: Sequence[float], b: Sequence[float],
                            resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED,
                            level: float = 0.95) -> tuple[float, float]:
    """Percentile-bootstrap interval of (median B − median A) / median A, in percent."""
    rng = np.random.default_rng(seed)
    xa, xb = np.asarray(a, float), np.asarray(b, float)
    ma = np.median(xa[rng.integers(0, len(xa), (resamples, len(xa)))], axis=1)
    mb = np.median(xb[rng.integers(0, len(xb), (resamples, len(xb)))], axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        change = (mb - ma) / ma * 100
    change = change[np.isfinite(change)]
    if not len(change):
        return float("nan"), float("nan")
    tail = (1 - level) / 2 * 100
    lo, hi = np.percentile(change, [tail, 100 - tail])
    return float(lo), float(hi)


def compare_samples(a: Sequence[float], b: Sequence[float]) -> Optional[Test]:
    """Both tests, or None when either side has fewer than MIN_SAMPLES samples."""
    if len(a) < MIN_SAMPLES or len(b) < MIN_SAMPLES:
        return None
    u, p = mann_whitney(a, b)
    ma, mb = float(np.median(a)), float(np.median(b))
    change = (mb - ma) / ma * 100 if ma else float("nan")
    lo, hi = bootstrap_median_change(a, b)
    return Test(len(a), len(b), u, p, change, lo, hi)


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (same order as given), capped at 1."""
    order = sorted(range(len(pvalues)), key=lambda i: pvalues[i])
    m, out, running = len(pvalues), [0.0] * len(pvalues), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        out[i] = running
    return out
