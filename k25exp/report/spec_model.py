"""A step-time model of speculative decoding, fitted from measured speculative steps, and the
projection of every measured point from the others (never from itself).

A verification step of a speculative server at concurrency c with k drafts per request
verifies V = c (k + 1) tokens and emits τ tokens per request (τ = E(α, k) at per-token
acceptance α; k25exp.serving.spec_acceptance), so TPOT = S / τ, with S the step's time. In a
closed loop of c requests of `n` output tokens each a request lives (n − 1) / τ decode steps,
so while one request decodes, the other c − 1 workers' new prompts (`p` tokens each) are
prefilled inside its steps at P = (c − 1) p τ / (n − 1) tokens per step: a higher acceptance
ends requests sooner and makes the average step carry more prefill (none at c = 1, where the
next prompt waits for the last token). The model, per drafter (method and scheduling), fitted
by least squares over measured steps S_meas = spec TPOT × tokens per step (vLLM's counters):

    S(c, k, α) = a + b V + q P          V = c (k + 1),  P = (c − 1) p E(α, k) / (n − 1)

(SmartSpec/TurboSpec, arXiv 2406.14066, fit the step time from measured steps in the same
spirit; a closed form that prices a verification step as an ordinary step of c (k+1) requests
cannot see the drafter, the rejection sampler or the scheduling mode.)

Projection of a point (drafter, k, α, c): S from the fit over the drafter's *other* points
(leave-one-out: the point's own measurement never enters), τ = E(α, k) for a synthetic
acceptance (configured, not measured), or, as the model achieves it, the tokens per step the
same run measured at its other levels; projected speedup = measured baseline TPOT / (S / τ).
With fewer than 4 other points (3 parameters), the step is the median of the other
acceptances' steps at the same (k, c) instead; each projection names what it used.

Break-even acceptance at c for a drafter and k: the α where the projected speedup over the
baseline is 1, i.e. E(α, k) = S(c, k, α) / base TPOT(c), found by bisection.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from statistics import median
from typing import Optional, Sequence

import numpy as np

from k25exp.serving.spec_acceptance import expected_tokens

MIN_FIT = 4  # points for a 3-parameter least-squares fit with one degree of freedom left


@dataclass(frozen=True)
class Point:
    """One measured point: medians over its rounds."""
    drafter: str             # the setting's method (and draft), what the fit is per
    k: int
    alpha: Optional[float]   # synthetic per-token acceptance; None = as the drafter achieves
    c: int
    base_ms: float           # baseline TPOT p50
    spec_ms: float           # speculative TPOT p50
    tau: float               # tokens per verification step (server's counters)
    speedup: float           # median over rounds of base / spec
    prompt_tokens: int
    output_tokens: int
    run: tuple = ()          # where it came from (report: its RunViews)
    sync_ms: Optional[float] = None  # baseline with async scheduling off
    speedup_lo: Optional[float] = None
    speedup_hi: Optional[float] = None
    rounds: int = 1

    @property
    def step_ms(self) -> float:
        return self.spec_ms * self.tau

    def label(self) -> str:
        return f"{self.drafter} k={self.k} {'α=%g' % self.alpha if self.alpha is not None else 'as model'} c={self.c}"


def prefill_per_step(c: int, k: int, tau: float, prompt_tokens: int, output_tokens: int) -> float:
    """P: prompt tokens prefilled per decode step in a closed loop (module docstring)."""
    return (c - 1) * prompt_tokens * tau / max(output_tokens - 1, 1)


def features(p: Point, tau: float) -> list[float]:
    return [1.0, p.c * (p.k + 1), prefill_per_step(p.c, p.k, tau, p.prompt_tokens, p.output_tokens)]


@dataclass
class Projection:
    point: Point
    tau: Optional[float]
    step_ms: Optional[float]
    speedup: Optional[float]
    used: str
    fit: dict = field(default_factory=dict)

    @property
    def error_pct(self) -> Optional[float]:
        if self.speedup is None or not self.point.speedup:
            return None
        return (self.speedup / self.point.speedup - 1.0) * 100.0


def fit_step(points: Sequence[Point]) -> Optional[np.ndarray]:
    """(a, b, q) of S = a + b V + q P by least squares over measured steps (P at each point's
    measured τ: these are measurements); q = 0 when V and P move together over the points
    (one k at one τ: the prefill term cannot be told apart); None with too few points."""
    if len(points) < MIN_FIT:
        return None
    X = np.array([features(p, p.tau) for p in points])
    y = np.array([p.step_ms for p in points])
    if np.linalg.matrix_rank(X) < 3:  # V and P move together (one k, one τ): P dropped
        if np.linalg.matrix_rank(X[:, :2]) < 2:
            return None
        coef, *_ = np.linalg.lstsq(X[:, :2], y, rcond=None)
        return np.array([coef[0], coef[1], 0.0])
    coef, *_ = np.linalg.lstsq(X, y, rcond=None)
    return coef


def projected_tau(p: Point, points: Sequence[Point]) -> tuple[Optional[float], str]:
    """τ for projecting p: E(α, k) when α is configured; as the model achieves it, the median
    of the same drafter and k's measured τ at other levels."""
    if p.alpha is not None:
        return expected_tokens(p.alpha, p.k), f"τ = E({p.alpha:g}, {p.k})"
    other = [q.tau for q in points if q.drafter == p.drafter and q.k == p.k and q.alpha is None
             and q.c != p.c]
    if not other:
        return None, "no other level of this drafter's own acceptance"
    return median(other), f"τ from c ≠ {p.c} ({len(other)} levels)"


def project(points: Sequence[Point]) -> list[Projection]:
    """Each point projected from the others (module docstring)."""
    out = []
    for p in points:
        others = [q for q in points if q is not p and q.drafter == p.drafter]
        tau, tau_used = projected_tau(p, points)
        coef = fit_step(others)
        if tau is None:
            out.append(Projection(p, None, None, None, tau_used))
            continue
        if coef is not None:
            step = float(np.dot(coef, features(p, tau)))
            used = f"fit over {len(others)} other points of {p.drafter}; {tau_used}"
            fit = {"a": float(coef[0]), "b": float(coef[1]), "q": float(coef[2])}
        else:
            same = [q.step_ms for q in others if q.k == p.k and q.c == p.c]
            if not same:
                out.append(Projection(p, tau, None, None, f"too few points: {len(others)} others "
                                      f"(a fit needs {MIN_FIT}), none at k={p.k}, c={p.c}"))
                continue
            step = median(same)
            used = f"median step of {len(same)} other acceptance(s) at k={p.k}, c={p.c}; {tau_used}"
            fit = {}
        out.append(Projection(p, tau, step, p.base_ms / (step / tau), used, fit))
    return out


def speedup_at(alpha: float, k: int, c: int, base_ms: float, coef: np.ndarray,
               prompt_tokens: int, output_tokens: int) -> float:
    """The fitted model's speedup over `base_ms` at acceptance α."""
    tau = expected_tokens(alpha, k)
    step = coef[0] + coef[1] * c * (k + 1) + coef[2] * prefill_per_step(c, k, tau, prompt_tokens,
                                                                         output_tokens)
    return base_ms / (step / tau)


def break_even(k: int, c: int, base_ms: float, coef: np.ndarray, prompt_tokens: int,
               output_tokens: int) -> Optional[float]:
    """The α where the projected speedup is 1 (bisection on [0, 1]); None when it is above 1
    even at α = 0 (never: a step emits at least one token) or below 1 even at α = 1."""
    f = lambda a: speedup_at(a, k, c, base_ms, coef, prompt_tokens, output_tokens) - 1.0  # noqa: E731
    lo, hi = 0.0, 1.0
    if f(hi) < 0:
        return None
    if f(lo) >= 0:
        return 0.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if f(mid) < 0 else (lo, mid)
    return (lo + hi) / 2
