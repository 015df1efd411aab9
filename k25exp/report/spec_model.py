"""A step-time model of speculative decoding, fitted from measured speculative steps, and the
projection of every measured point from the others (never from itself).

A verification step of a speculative server at concurrency c with k drafts per request
verifies c (k + 1) tokens and emits τ tokens per request (τ = E(α, k) at per-token acceptance
α; k25exp.serving.spec_acceptance), so TPOT = S / τ, with S the step's time. The step is
priced against the *reference* step measured at the same c in the same job: the baseline's
TPOT (one token per request per step), run with the scheduling the drafter runs (the baseline
without async scheduling for a drafter that turns it off, vLLM's ngram; the baseline for one
that keeps it, ngram_gpu, eagle): that step already holds whatever an ordinary step of c
requests costs at c (GEMM shapes, attention, collectives, the scheduling mode), measured, not
modelled. What speculation adds is fitted by least squares over the drafter's measured steps
S_meas = spec TPOT × tokens per step (vLLM's counters):

    S(c, k, α) − R(c) = a + b c k + d c + q ΔP       ΔP = (c − 1) p (E(α, k) − 1) / (n − 1)

b: the k extra tokens per request verified; d: per-request costs of drafting and rejection
sampling; a: per-step costs; q: the extra prefill a closed loop shares with each step (a
request lives (n − 1) / τ decode steps, so the other c − 1 workers' new prompts of p tokens
are prefilled at (c − 1) p τ / (n − 1) tokens per step, τ − 1 more per step than the
reference's). Columns the points cannot tell apart are dropped, last first (ΔP, then c: one
k leaves c k and c proportional). SmartSpec/TurboSpec (arXiv 2406.14066) fit a step time from
measured steps in the same spirit; a closed form that prices a verification step as an
ordinary step of c (k + 1) requests cannot see the drafter, the sampler or the scheduling.

Projection of a point (drafter, k, α, c): S from the fit over the drafter's *other* points
(leave-one-out: the point's own speculative measurement never enters; its reference step R(c)
is the baselines' measurement, not the speculative server's); τ for a synthetic acceptance =
1 + η (E(α, k) − 1), η the drafter's proposal efficiency measured at its other points of the
same k (an n-gram drafter that finds no match proposes fewer than k tokens, and a position
never proposed is never accepted: on the CPU default η fell to 0.76 at k = 5, α = 0.9), or,
as the model achieves it, the tokens per step the same run measured at its other levels; projected speedup = measured baseline TPOT / (S / τ).
With fewer other points than the fit has columns + 1, the step is the median of the other
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

COLUMNS = ("a", "b", "d", "q")  # the fitted coefficients' names (module docstring)


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
    ref_ms: Optional[float] = None   # the reference step R(c) (module docstring); None: base_ms

    @property
    def step_ms(self) -> float:
        return self.spec_ms * self.tau

    @property
    def reference_ms(self) -> float:
        return self.base_ms if self.ref_ms is None else self.ref_ms

    def label(self) -> str:
        return f"{self.drafter} k={self.k} {'α=%g' % self.alpha if self.alpha is not None else 'as model'} c={self.c}"


def extra_prefill(c: int, k: int, tau: float, prompt_tokens: int, output_tokens: int) -> float:
    """ΔP: prompt tokens prefilled per decode step in a closed loop beyond the reference's
    (module docstring)."""
    return (c - 1) * prompt_tokens * (tau - 1.0) / max(output_tokens - 1, 1)


def features(p: Point, tau: float) -> list[float]:
    return [1.0, p.c * p.k, p.c, extra_prefill(p.c, p.k, tau, p.prompt_tokens, p.output_tokens)]


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
    """(a, b, d, q) of S − R = a + b c k + d c + q ΔP by least squares over measured steps (ΔP
    at each point's measured τ: these are measurements); a column the points cannot tell
    apart from the others is 0, the last first; None with fewer points than kept columns + 1
    (one degree of freedom left)."""
    if not points:
        return None
    X = np.array([features(p, p.tau) for p in points])
    y = np.array([p.step_ms - p.reference_ms for p in points])
    cols = list(range(X.shape[1]))
    while cols and np.linalg.matrix_rank(X[:, cols]) < len(cols):
        cols.pop()
    if len(points) < len(cols) + 1:
        return None
    coef = np.zeros(X.shape[1])
    coef[cols], *_ = np.linalg.lstsq(X[:, cols], y, rcond=None)
    return coef


def efficiency_ratios(points: Sequence[Point], drafter: str, k: int,
                      leave_out: Optional[Point] = None) -> list[float]:
    """(τ − 1) / (E(α, k) − 1) of the drafter's synthetic points at k (but `leave_out`)."""
    return [(q.tau - 1.0) / (e - 1.0) for q in points
            if q is not leave_out and q.drafter == drafter and q.k == k and q.alpha is not None
            and (e := expected_tokens(q.alpha, q.k)) > 1.0]


def proposal_efficiency(p: Point, points: Sequence[Point]) -> tuple[float, str]:
    """η: how much of a configured acceptance's E(α, k) − 1 the drafter's steps emitted, the
    median of (τ − 1) / (E(α, k) − 1) over the drafter's *other* synthetic points at the same
    k. Below 1 when the drafter proposes fewer than k tokens (n-gram lookup finds no match,
    or a shorter one): those positions are never offered to the sampler. 1 (said so) with no
    other point."""
    ratios = efficiency_ratios(points, p.drafter, p.k, leave_out=p)
    if not ratios:
        return 1.0, "η = 1 (no other point at this k)"
    eta = median(ratios)
    return eta, f"η = {eta:.3f} from {len(ratios)} other points at k={p.k}"


def projected_tau(p: Point, points: Sequence[Point]) -> tuple[Optional[float], str]:
    """τ for projecting p: at a configured α, 1 + η (E(α, k) − 1), η the drafter's proposal
    efficiency at other points (proposal_efficiency); as the model achieves it, the median of
    the same drafter and k's measured τ at other levels."""
    if p.alpha is not None:
        eta, how = proposal_efficiency(p, points)
        return 1.0 + eta * (expected_tokens(p.alpha, p.k) - 1.0), f"τ = 1 + η (E({p.alpha:g}, {p.k}) − 1), {how}"
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
            step = p.reference_ms + float(np.dot(coef, features(p, tau)))
            used = f"fit over {len(others)} other points of {p.drafter}; {tau_used}"
            fit = dict(zip(COLUMNS, map(float, coef)))
        else:
            same = [q.step_ms for q in others if q.k == p.k and q.c == p.c]
            if not same:
                out.append(Projection(p, tau, None, None, f"too few points to fit: {len(others)} "
                                      f"others, none at k={p.k}, c={p.c}"))
                continue
            step = median(same)
            used = f"median step of {len(same)} other acceptance(s) at k={p.k}, c={p.c}; {tau_used}"
            fit = {}
        out.append(Projection(p, tau, step, p.base_ms / (step / tau), used, fit))
    return out


def speedup_at(alpha: float, k: int, c: int, base_ms: float, ref_ms: float, coef: np.ndarray,
               prompt_tokens: int, output_tokens: int, eta: float = 1.0) -> float:
    """The fitted model's speedup over `base_ms` at acceptance α (ref_ms: R(c); eta: the
    drafter's proposal efficiency, proposal_efficiency)."""
    tau = 1.0 + eta * (expected_tokens(alpha, k) - 1.0)
    step = ref_ms + float(np.dot(coef, [1.0, c * k, c, extra_prefill(c, k, tau, prompt_tokens,
                                                                      output_tokens)]))
    return base_ms / (step / tau)


def break_even(k: int, c: int, base_ms: float, ref_ms: float, coef: np.ndarray,
               prompt_tokens: int, output_tokens: int, eta: float = 1.0) -> Optional[float]:
    """The α where the projected speedup is 1 (bisection on [0, 1]); 0 when it pays even at
    α = 0; None when it stays below 1 even at α = 1 (never)."""
    f = lambda a: speedup_at(a, k, c, base_ms, ref_ms, coef, prompt_tokens, output_tokens, eta) - 1.0  # noqa: E731
    lo, hi = 0.0, 1.0
    if f(hi) < 0:
        return None
    if f(lo) >= 0:
        return 0.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if f(mid) < 0 else (lo, mid)
    return (lo + hi) / 2
