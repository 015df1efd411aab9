"""Open-loop arrival schedules: when each request is due, independent of the responses.

Inter-arrival times are gamma-distributed with shape `burstiness` and mean 1 / rate, as vLLM's
`bench serve` draws them (`np.random.gamma(shape=burstiness, scale=1 / (rate × burstiness))`):
burstiness 1 is a Poisson process (exponential gaps, coefficient of variation 1); above 1 the
gaps are more regular (CV = 1 / √burstiness), below 1 burstier. The first request is due at 0.
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np


def schedule(rate: float, burstiness: float, seed: int, n: Optional[int] = None,
             duration_s: Optional[float] = None, exact: bool = False) -> np.ndarray:
    """Due times (s from the level's start) of `n` requests, or of every request due within
    `duration_s`. rate = inf: all due at once. exact (with n): the drawn times scaled so that
    they realise `rate` exactly ((n − 1) / last = rate), the gaps' shape (CV) unchanged: n
    random gaps are otherwise about ±1/√n off the mean (±22 % at n = 20), which made probes
    of one search not comparable."""
    if (n is None) == (duration_s is None):
        raise ValueError("give exactly one of n and duration_s")
    if not rate > 0:
        raise ValueError(f"request rate {rate}: expected > 0 requests/s (or inf)")
    if not burstiness > 0:
        raise ValueError(f"burstiness {burstiness}: expected > 0 (1 = Poisson)")
    if math.isinf(rate):
        if n is None:
            raise ValueError("request rate inf needs a request count, not a duration")
        return np.zeros(n)
    rng = np.random.default_rng(seed)
    scale = 1.0 / (rate * burstiness)
    if n is not None:
        gaps = rng.gamma(burstiness, scale, size=max(n - 1, 0))
        if exact and len(gaps) and gaps.sum() > 0:
            gaps *= (len(gaps) / rate) / gaps.sum()
        return np.concatenate([[0.0], np.cumsum(gaps)])
    times = [0.0]
    while True:  # draw in blocks until past the duration
        block = times[-1] + np.cumsum(rng.gamma(burstiness, scale, size=256))
        keep = block[block < duration_s]
        times.extend(keep.tolist())
        if len(keep) < len(block):
            return np.asarray(times)


def rate_of(times) -> Optional[float]:
    """The rate a list of send times realises: (n − 1) / (last − first); None below 2."""
    ts = sorted(times)
    if len(ts) < 2 or ts[-1] <= ts[0]:
        return None
    return (len(ts) - 1) / (ts[-1] - ts[0])
