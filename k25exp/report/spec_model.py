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

    S(c, k, α) − R(c) = g_c + b_c k + h c τ + q ΔP       ΔP = (c − 1) p (τ − 1) / (n − 1)

g_c: what speculation adds at c whatever k and α (per-request drafting, rejection sampling,
the attention path a multi-token query takes: on the CPU build ~3.5–7 ms per request, not a
line in c, so one intercept per measured concurrency, fitted from the *other* points at that
c); b_c: per draft token per step at c, what verifying the k extra tokens of each of the c
requests costs, one slope per level because that cost is no line in c k on a GPU (an H100's
Kimi rank: ~0.5 ms per draft token at c = 1, ~2 ms at c = 64 for 64 × more tokens: the
verification GEMMs are weight-bound at small batch, and CUDA graphs pad to their captured
sizes); h: per token emitted (output processing, detokenizing, streaming: τ per request
instead of 1); q: the extra prefill a closed loop shares with each step (a request lives
(n − 1) / τ decode steps, so the other c − 1 workers' new prompts of p tokens are prefilled at
(c − 1) p τ / (n − 1) tokens per step, τ − 1 more per step than the reference's). Where the
left-out point's c has no other point, the global form S − R = a + b c k + d c + q ΔP
(d: per request) is fitted instead. Columns the points cannot tell apart are dropped: a
level's b_c where that level's points have one k (it lies inside g_c); with one k at every
level, h and q go too, so each level's excess is the mean of its other points' (fitting h and
q from one k's few acceptances projected worse on a CPU); then, should the rest still be
rank-deficient, the last first. The per-level slope against one slope b c k, leave-one-out:
24 of 24 points within 10 % (median 2.0 %) against 14 of 24 (8.7 %) on an H100's ngram_gpu
k = 1 / 5 over 3 rounds; 29 of 36 (4.4 %) against 30 of 36 (3.8 %) on a 2-core AVX-512 CPU's
n-gram k = 1 / 3 / 5, and 27 against 28 of 36 on a later campaign held out from the choice
(docs/guides/spec-decode.md). SmartSpec/TurboSpec (arXiv 2406.14066)
fit a step time from measured steps in the same spirit; a closed form that prices a
verification step as an ordinary step of c (k + 1) requests cannot see the drafter, the
sampler or the scheduling.

τ for a synthetic acceptance: a drafter need not propose all k positions (n-gram lookup
proposes only as far as its match goes), and a position never proposed is never accepted. If
position i is proposed with probability φ^i (φ: the drafter's *reach*), the expected tokens
per step are 1 + Σ (φα)^i = E(φα, k): the drafter runs at an effective acceptance φα. φ is
the median over the drafter's *other* synthetic points at the same k of the φ that solves
E(φα, k) = τ measured (on the CPU default's n-gram, φ ≈ 0.94–0.95 at k = 3 and 5, and its
mean proposal Σ φ^i matches vLLM's own draft-token counters). As the model achieves it, τ is
the median of the same drafter and k's measured τ at other levels.

Projection of a point (drafter, k, α, c): S from the fit over the drafter's other points
(leave-one-out: the point's own speculative measurement never enters; its reference step R(c)
is the baselines' measurement, not the speculative server's); projected speedup = measured
baseline TPOT / (S / τ). With fewer other points than the fit has columns + 1, the step is
the median of the other acceptances' steps at the same (k, c) instead; each projection names
what it used.

Break-even acceptance at c for a drafter and k: the α where the projected speedup over the
baseline is 1, i.e. E(φα, k) = S(c, k, α) / base TPOT(c), found by bisection.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from statistics import median
from typing import Optional, Sequence

import numpy as np

from k25exp.serving.spec_acceptance import expected_tokens

GLOBAL = ("a", "b", "d", "q")   # the global form's coefficients (module docstring)
PER_LEVEL = ("h", "q")          # beside an intercept g_c and a k slope b_c per level


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
    left_out: int = 0        # runs whose point was invalid or shared its host, left out
    valid: bool = True       # False: every run's point was (listed, never fitted)
    rounds_left_out: int = 0  # rounds the kept runs left out themselves (spec_decode_results)
    shared: bool = False     # True: no run had its host alone at this point (kept, marked)

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


@dataclass(frozen=True)
class StepFit:
    """S − R fitted over measured steps: an intercept and a k slope per level in `levels` (the
    per-level form) or, with no levels, the global form (module docstring)."""
    levels: tuple[int, ...]
    coef: tuple[float, ...]      # the intercepts (per level), then the named slopes

    def covers(self, c: int) -> bool:
        return not self.levels or c in self.levels

    def excess(self, c: int, k: int, tau: float, prompt_tokens: int, output_tokens: int) -> float:
        """What speculation adds to the reference step at (c, k, τ)."""
        return float(np.dot(self.coef, _row(self.levels, c, k, tau, prompt_tokens, output_tokens)))

    def named(self) -> dict[str, float]:
        names = ([f"g{c}" for c in self.levels] + [f"b{c}" for c in self.levels] + list(PER_LEVEL)
                 if self.levels else list(GLOBAL))
        return dict(zip(names, self.coef))

    def describe(self) -> str:
        return "an intercept and a k slope per c" if self.levels else "the global form"


def _row(levels: tuple[int, ...], c: int, k: int, tau: float, prompt_tokens: int,
         output_tokens: int) -> list[float]:
    dp = extra_prefill(c, k, tau, prompt_tokens, output_tokens)
    if levels:
        at = [1.0 if c == x else 0.0 for x in levels]   # this point's level, one-hot
        return at + [k * x for x in at] + [c * tau, dp]
    return [1.0, c * k, c, dp]


def fit_step(points: Sequence[Point], per_level: bool = True) -> Optional[StepFit]:
    """S − R by least squares over measured steps (ΔP and c τ at each point's measured τ: these
    are measurements), per level or global; a column the points cannot tell apart is 0 (module
    docstring: a level's k slope where it has one k; h and q with one k everywhere; then the
    last first); None with fewer points than kept columns + 1 (one degree of freedom left)."""
    if not points:
        return None
    levels = tuple(sorted({p.c for p in points})) if per_level else ()
    X = np.array([_row(levels, p.c, p.k, p.tau, p.prompt_tokens, p.output_tokens) for p in points])
    y = np.array([p.step_ms - p.reference_ms for p in points])
    cols = list(range(X.shape[1]))
    if levels:
        n = len(levels)
        slopes = [n + i for i, c in enumerate(levels) if len({p.k for p in points if p.c == c}) > 1]
        cols = list(range(n)) + slopes + ([2 * n, 2 * n + 1] if slopes else [])
    while cols and np.linalg.matrix_rank(X[:, cols]) < len(cols):
        cols.pop()
    if len(points) < len(cols) + 1:
        return None
    coef = np.zeros(X.shape[1])
    coef[cols], *_ = np.linalg.lstsq(X[:, cols], y, rcond=None)
    return StepFit(levels, tuple(float(x) for x in coef))


def fit_for(c: int, points: Sequence[Point]) -> Optional[StepFit]:
    """The per-level fit when `points` have c among their levels, else the global form."""
    fit = fit_step(points)
    if fit is not None and fit.covers(c):
        return fit
    return fit_step(points, per_level=False)


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

    @property
    def in_interval(self) -> Optional[bool]:
        """Whether the projection lies inside the measured speedup's interval."""
        p = self.point
        if self.speedup is None or p.speedup_lo is None or p.speedup_hi is None:
            return None
        return p.speedup_lo <= self.speedup <= p.speedup_hi


def reach_of(tau: float, alpha: float, k: int) -> float:
    """φ with E(φα, k) = τ (bisection; E rises with its acceptance): 1 at or above E(α, k),
    0 at or below 1 token per step."""
    if alpha <= 0.0 or tau <= 1.0:
        return 0.0
    if tau >= expected_tokens(alpha, k):
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_tokens(mid * alpha, k) < tau else (lo, mid)
    return (lo + hi) / 2


def reaches(points: Sequence[Point], drafter: str, k: int,
            leave_out: Optional[Point] = None) -> list[float]:
    """φ of each of the drafter's synthetic points at k (but `leave_out`)."""
    return [reach_of(q.tau, q.alpha, q.k) for q in points
            if q is not leave_out and q.drafter == drafter and q.k == k and q.alpha is not None]


def proposal_reach(p: Point, points: Sequence[Point]) -> tuple[float, str]:
    """φ for projecting p: the median over the drafter's *other* synthetic points at the same
    k; 1 (said so) with no other point."""
    phis = reaches(points, p.drafter, p.k, leave_out=p)
    if not phis:
        return 1.0, "φ = 1 (no other point at this k)"
    phi = median(phis)
    return phi, f"φ = {phi:.3f} from {len(phis)} other points at k={p.k}"


def tau_at(alpha: float, k: int, phi: float = 1.0) -> float:
    """Tokens per step at acceptance α for a drafter of reach φ: E(φα, k)."""
    return expected_tokens(phi * alpha, k)


def projected_tau(p: Point, points: Sequence[Point]) -> tuple[Optional[float], str]:
    """τ for projecting p: at a configured α, E(φα, k) with the drafter's reach φ from other
    points (proposal_reach); as the model achieves it, the median of the same drafter and k's
    measured τ at other levels."""
    if p.alpha is not None:
        phi, how = proposal_reach(p, points)
        return tau_at(p.alpha, p.k, phi), f"τ = E({phi:.3f} × {p.alpha:g}, {p.k}), {how}"
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
        if tau is None:
            out.append(Projection(p, None, None, None, tau_used))
            continue
        fit = fit_for(p.c, others)
        if fit is not None:
            step = p.reference_ms + fit.excess(p.c, p.k, tau, p.prompt_tokens, p.output_tokens)
            used = f"fit over {len(others)} other points of {p.drafter} ({fit.describe()}); {tau_used}"
            named = fit.named()
        else:
            same = [q.step_ms for q in others if q.k == p.k and q.c == p.c]
            if not same:
                out.append(Projection(p, tau, None, None, f"too few points to fit: {len(others)} "
                                      f"others, none at k={p.k}, c={p.c}"))
                continue
            step = median(same)
            used = f"median step of {len(same)} other acceptance(s) at k={p.k}, c={p.c}; {tau_used}"
            named = {}
        out.append(Projection(p, tau, step, p.base_ms / (step / tau), used, named))
    return out


def speedup_at(alpha: float, k: int, c: int, base_ms: float, ref_ms: float, fit: StepFit,
               prompt_tokens: int, output_tokens: int, phi: float = 1.0) -> float:
    """The fitted model's speedup over `base_ms` at acceptance α (ref_ms: R(c); phi: the
    drafter's reach, proposal_reach)."""
    tau = tau_at(alpha, k, phi)
    return base_ms / ((ref_ms + fit.excess(c, k, tau, prompt_tokens, output_tokens)) / tau)


def break_even(k: int, c: int, base_ms: float, ref_ms: float, fit: StepFit,
               prompt_tokens: int, output_tokens: int, phi: float = 1.0) -> Optional[float]:
    """The α where the projected speedup is 1 (bisection on [0, 1]); 0 when it pays even at
    α = 0; None when it stays below 1 even at α = 1 (never)."""
    f = lambda a: speedup_at(a, k, c, base_ms, ref_ms, fit, prompt_tokens, output_tokens, phi) - 1.0  # noqa: E731
    lo, hi = 0.0, 1.0
    if f(hi) < 0:
        return None
    if f(lo) >= 0:
        return 0.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if f(mid) < 0 else (lo, mid)
    return (lo + hi) / 2
