"""The speculative step model on hand-built steps: every figure below is worked out by hand
from S = R(c) + A + B c k + D c + H c τ + Q ΔP, ΔP = (c − 1) p (τ − 1) / (n − 1), τ = E(φα, k).
In the per-level form A + D c is the intercept g_c and B c the k slope b_c of each measured
concurrency."""

from __future__ import annotations

import pytest

from k25exp.report.spec_model import Point, break_even, fit_step, project, reach_of
from k25exp.serving.spec_acceptance import conditional_rates, expected_tokens, unconditional_rates

P_TOK, N_OUT = 128, 65  # n − 1 = 64: ΔP = (c − 1) × 128 × (τ − 1) / 64 = 2 (c − 1)(τ − 1)
A, B, D, Q = 0.5, 0.2, 0.1, 0.01  # ms, ms per extra verified token, ms per request, per prefill token


def ref(c):   # the reference step measured at c (the baseline without async scheduling)
    return 3.0 + 0.25 * c


def base(c):  # the baseline's TPOT at c (async scheduling): the speedup's numerator
    return 2.5 + 0.25 * c


def step(c, k, tau, h=0.0):
    return ref(c) + A + B * c * k + D * c + h * c * tau + Q * 2 * (c - 1) * (tau - 1)


def point(k, alpha, c, spec=None, drafter="ngram", phi=1.0, h=0.0, tau=None):
    tau = expected_tokens(phi * alpha, k) if tau is None else tau
    spec = step(c, k, tau, h) / tau if spec is None else spec
    return Point(drafter, k, alpha, c, base_ms=base(c), spec_ms=spec, tau=tau,
                 speedup=base(c) / spec, prompt_tokens=P_TOK, output_tokens=N_OUT, ref_ms=ref(c))


def grid(**kw):
    return [point(k, a, c, **kw) for k in (1, 3) for a in (0.5, 0.9) for c in (1, 4)]


def test_acceptance_rates_by_hand():
    assert unconditional_rates(0.5, 3) == [0.5, 0.25, 0.125]
    assert conditional_rates([0.5, 0.25, 0.125]) == [0.5, 0.5, 0.5]  # i.i.d.: each position α
    assert conditional_rates([0.9, 0.0, 0.0]) == [0.9, 0.0, 0.0]     # nothing after a zero
    assert expected_tokens(0.5, 3) == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    assert expected_tokens(1.0, 3) == 4.0 and expected_tokens(0.0, 3) == 1.0
    with pytest.raises(ValueError, match="alpha=1.5"):
        unconditional_rates(1.5, 3)


def test_one_hand_computed_point():
    # k = 3, α = 0.5, c = 4: τ = 1.875, R = 4, c k = 12, ΔP = 2 × 3 × 0.875 = 5.25,
    # S = 4 + 0.5 + 2.4 + 0.4 + 0.0525 = 7.3525; base TPOT 3.5
    p = point(3, 0.5, 4)
    assert p.tau == pytest.approx(1.875) and p.step_ms == pytest.approx(7.3525)
    assert p.speedup == pytest.approx(3.5 / (7.3525 / 1.875))


def test_each_point_is_projected_from_the_others_only():
    pts = grid()
    fit = fit_step(pts)
    # an intercept and a k slope per level: g1 = A + D = 0.6, g4 = A + 4 D = 0.9, b1 = B,
    # b4 = 4 B; h = 0, q = Q
    assert fit.levels == (1, 4)
    assert fit.named() == pytest.approx({"g1": 0.6, "g4": 0.9, "b1": B, "b4": 4 * B, "h": 0.0, "q": Q})
    for pr in project(pts):  # exact data: every leave-one-out fit finds the same model
        assert pr.error_pct == pytest.approx(0.0, abs=1e-9)
        assert pr.used.startswith("fit over 7 other points of ngram (an intercept and a k slope "
                                  "per c); τ = E(")
        assert pr.used.endswith("φ = 1.000 from 3 other points at k=" + str(pr.point.k))
    # the held-out point measured twice as slow: its projection does not move (its own
    # measurement never enters), so it reads +100 % against it
    slow = point(3, 0.5, 4, spec=2 * 7.3525 / 1.875)
    pts = [slow if (p.k, p.alpha, p.c) == (3, 0.5, 4) else p for p in grid()]
    pr = next(x for x in project(pts) if x.point is slow)
    assert pr.step_ms == pytest.approx(7.3525) and pr.error_pct == pytest.approx(100.0)


def test_a_cost_per_token_emitted_is_told_from_the_verified_tokens():
    # H = 0.3 ms per token emitted per request (output processing): steps at α = 0.9 cost
    # more than at 0.5 at the same (k, c); the fit finds h, and the held-out point (k = 3,
    # α = 0.9, c = 4) is projected exactly: τ = 3.439, S = 4 + 0.5 + 2.4 + 0.4 + 0.3 × 4 ×
    # 3.439 + 0.01 × 2 × 3 × 2.439 = 11.57314
    pts = grid(h=0.3)
    assert fit_step(pts).named()["h"] == pytest.approx(0.3)
    pr = next(x for x in project(pts) if (x.point.k, x.point.alpha, x.point.c) == (3, 0.9, 4))
    assert pr.step_ms == pytest.approx(11.57314) and pr.error_pct == pytest.approx(0.0, abs=1e-9)


def test_a_level_without_other_points_takes_the_global_form():
    # a point at c = 16 alone: no other point has its intercept, so the global form
    # (a, b c k, d c, q ΔP) fitted over the 8 others projects it. By hand (k = 1, α = 0.5):
    # τ = 1.5, R = 7, S = 7 + 0.5 + 3.2 + 1.6 + 0.01 × 2 × 15 × 0.5 = 12.45
    lone = point(1, 0.5, 16)
    pr = next(x for x in project(grid() + [lone]) if x.point is lone)
    assert "(the global form)" in pr.used
    assert pr.fit == pytest.approx({"a": A, "b": B, "d": D, "q": Q})
    assert pr.step_ms == pytest.approx(12.45)


def test_the_reference_step_carries_what_an_ordinary_step_costs_at_c():
    # the same points with a reference step 10 ms slower at c = 4 (a measured baseline whose
    # step is not linear in c): the fit is unchanged, and the projection follows the reference
    pts = grid()
    bumped = [Point(p.drafter, p.k, p.alpha, p.c, p.base_ms, p.spec_ms + (10 / p.tau if p.c == 4 else 0),
                    p.tau, p.speedup, P_TOK, N_OUT, ref_ms=p.ref_ms + (10 if p.c == 4 else 0))
              for p in pts]
    assert fit_step(bumped).named() == pytest.approx(fit_step(pts).named())
    pr = project(bumped)[1]   # k = 1, α = 0.5, c = 4: S = 4 + 10 + 0.5 + 0.8 + 0.4 + 0.03
    assert pr.step_ms == pytest.approx(15.73)


def test_reach_by_hand():
    # φ = 0.8, α = 0.5, k = 3: effective acceptance 0.4, τ = 1 + 0.4 + 0.16 + 0.064 = 1.624
    assert reach_of(1.624, 0.5, 3) == pytest.approx(0.8, abs=1e-9)
    assert reach_of(1.875, 0.5, 3) == 1.0 and reach_of(1.0, 0.5, 3) == 0.0


def test_a_drafter_that_proposes_less_than_k_emits_less_than_E():
    # position i proposed with probability 0.8^i (n-gram lookup without a match) at every
    # point but the held-out one, whose own τ (2.0) never enters
    pts = grid(phi=0.8)
    odd = point(3, 0.9, 4, phi=0.8, tau=2.0)
    pts = [odd if (p.k, p.alpha, p.c) == (3, 0.9, 4) else p for p in pts]
    pr = next(x for x in project(pts) if x.point is odd)
    # by hand: φ α = 0.72, τ = 1 + 0.72 + 0.5184 + 0.373248 = 2.611648 (φ = 0.8 from the 3
    # others at k = 3)
    assert pr.tau == pytest.approx(2.611648) and "φ = 0.800 from 3 other points at k=3" in pr.used


def test_few_points_fall_back_to_the_other_acceptances_step():
    # two acceptances at one (k, c): each is projected with the other's step
    a, b = point(3, 0.5, 1), point(3, 0.9, 1)
    pa, pb = project([a, b])
    assert pa.step_ms == pytest.approx(b.step_ms) and "1 other acceptance" in pa.used
    # by hand: S(0.9) at c = 1 = 3.25 + 0.5 + 0.6 + 0.1 + 0 (no other request's prefill)
    # = 4.45; τ(0.5) = 1.875, base 2.75
    assert pa.speedup == pytest.approx(2.75 / (4.45 / 1.875))
    # a drafter is never fitted with another's steps, and a lone point has no projection
    lone = point(3, 0.5, 1, drafter="eagle3")
    assert project([a, b, lone])[2].speedup is None


def test_as_the_model_achieves_tau_comes_from_other_levels():
    # the drafter's own acceptance: τ 2.5 measured at c = 2 … 16, 3.0 at c = 1
    def own(c, tau):
        s = step(c, 3, tau) / tau
        return Point("ngram", 3, None, c, base(c), s, tau, base(c) / s, P_TOK, N_OUT, ref_ms=ref(c))

    pts = [own(1, 3.0)] + [own(c, 2.5) for c in (2, 4, 8, 16)]
    pr1 = project(pts)[0]
    assert pr1.tau == 2.5 and "τ from c ≠ 1 (4 levels)" in pr1.used  # not its own 3.0
    # c = 1 has no other point: the global form, one k at one τ: c k = 3c, and ΔP = 3 (c − 1),
    # all in {1, c}: the fit keeps a' + b' 3c with b' = B + D / 3 + Q = 0.24333,
    # a' = A − 3 Q = 0.47 (d's and q's parts folded in): S(c = 1) = 3.25 + 0.47 + 0.73 = 4.45,
    # the whole model's 3.25 + 0.5 + 0.6 + 0.1 + 0
    assert pr1.fit["q"] == 0.0 and pr1.fit["d"] == 0.0
    assert pr1.fit["b"] == pytest.approx(B + D / 3 + Q) and pr1.fit["a"] == pytest.approx(0.47)
    assert pr1.step_ms == pytest.approx(4.45) and pr1.speedup == pytest.approx(2.75 / (4.45 / 2.5))
    assert project(pts[:1])[0].speedup is None  # no other level: no τ to project with


def test_break_even_by_hand():
    fit = fit_step(grid(), per_level=False)   # the global form: exactly (A, B, D, Q)
    assert fit.named() == pytest.approx({"a": A, "b": B, "d": D, "q": Q})
    # k = 1, c = 1 (no prefill shares the step), R = 2.2, base 2: S = 2.2 + 0.8 = 3, 2 τ = 3
    # → τ = 1.5, α = 0.5; at c = 4, R = base = 4: S = 5.7 + 0.06 (τ − 1), 4 τ = S → τ = 5.64 / 3.94
    assert break_even(1, 1, 2.0, 2.2, fit, P_TOK, N_OUT) == pytest.approx(0.5, abs=1e-9)
    assert break_even(1, 4, 4.0, 4.0, fit, P_TOK, N_OUT) == pytest.approx(5.64 / 3.94 - 1, abs=1e-9)
    assert break_even(1, 1, 4.0, 2.2, fit, P_TOK, N_OUT) == 0.0   # pays at any acceptance
    assert break_even(1, 1, 1.0, 2.2, fit, P_TOK, N_OUT) is None  # never pays (α = 1: 2 / 3)
    # a reach of 0.5 halves the effective acceptance: τ = 1.5 needs φ α = 0.5, α = 1
    assert break_even(1, 1, 2.0, 2.2, fit, P_TOK, N_OUT, phi=0.5) == pytest.approx(1.0, abs=1e-9)
    # the per-level form prices the same: g1 = 0.6 = A + D
    assert break_even(1, 1, 2.0, 2.2, fit_step(grid()), P_TOK, N_OUT) == pytest.approx(0.5, abs=1e-9)


def test_one_k_keeps_only_the_intercepts():
    # one draft length: k is constant within a level, so each level's k slope lies inside its
    # intercept; with no k slope left, h c τ and q ΔP go too, so each level's excess is the
    # mean of its points' (kept on purpose: fitting h and q from the α's of one k projected
    # worse on a 2-core AVX-512 CPU's k = 1 / 3 / 5 subsets, 8 / 10 / 7 of 12 within 10 %
    # against 11 / 11 / 8).
    # By hand, k = 3, H = 0.3: τ = 1.875 (α 0.5), 3.439 (α 0.9); excess S − R at
    #   c = 1: 0.5 + 0.6 + 0.1 + 0.3 τ            = 1.7625 and 2.2317
    #   c = 4: 0.5 + 2.4 + 0.4 + 1.2 τ + 0.06 (τ − 1) = 5.6025 and 7.57314
    pts = [point(3, a, c, h=0.3) for a in (0.5, 0.9) for c in (1, 4)]
    fit = fit_step(pts)
    assert fit.named() == pytest.approx({"g1": (1.7625 + 2.2317) / 2, "g4": (5.6025 + 7.57314) / 2,
                                         "b1": 0.0, "b4": 0.0, "h": 0.0, "q": 0.0})


def test_the_cost_of_a_draft_token_is_fitted_per_level():
    # a GPU's verification: a draft token costs 0.5 ms per step at c = 1 but only 0.6 ms for
    # all 4 requests' at c = 4 (weight-bound GEMMs, padded CUDA graphs): no line in c k. By
    # hand, S − R = g_c + β_c k with g1 = 2, g4 = 3, β1 = 0.5, β4 = 0.6 (h = q = 0), so the
    # held-out point (k = 3, α = 0.9, c = 4) is S = R(4) + 3 + 1.8 = 4 + 4.8 = 8.8 ms
    beta, g = {1: 0.5, 4: 0.6}, {1: 2.0, 4: 3.0}

    def gpu(k, a, c):
        tau = expected_tokens(a, k)
        s = ref(c) + g[c] + beta[c] * k
        return Point("ngram_gpu", k, a, c, base(c), s / tau, tau, base(c) * tau / s, P_TOK, N_OUT,
                     ref_ms=ref(c))

    pts = [gpu(k, a, c) for k in (1, 3) for a in (0.5, 0.9) for c in (1, 4)]
    assert fit_step(pts).named() == pytest.approx({"g1": 2.0, "g4": 3.0, "b1": 0.5, "b4": 0.6,
                                                   "h": 0.0, "q": 0.0}, abs=1e-9)
    pr = next(x for x in project(pts) if (x.point.k, x.point.alpha, x.point.c) == (3, 0.9, 4))
    assert pr.step_ms == pytest.approx(8.8) and pr.error_pct == pytest.approx(0.0, abs=1e-9)


def test_a_level_with_one_k_keeps_its_intercept_and_the_shared_slopes():
    # c = 16 measured at k = 3 only (α 0.5 and 0.9): its k slope lies inside its intercept and
    # is dropped, nothing else is (h and q still come from the levels of two k). Held out,
    # k = 3, α = 0.5, c = 16 is projected from its α = 0.9 sibling and the shared q. By hand:
    # τ = 1.875, R = 7, S = 7 + 0.5 + 9.6 + 1.6 + 0.01 × 2 × 15 × 0.875 = 18.9625
    pts = grid() + [point(3, a, 16) for a in (0.5, 0.9)]
    fit = fit_step(pts)
    assert fit.named()["b16"] == 0.0 and fit.named()["q"] == pytest.approx(Q)
    assert fit.named()["b4"] == pytest.approx(4 * B)
    pr = next(x for x in project(pts) if (x.point.k, x.point.alpha, x.point.c) == (3, 0.5, 16))
    assert pr.step_ms == pytest.approx(18.9625) and pr.error_pct == pytest.approx(0.0, abs=1e-9)
