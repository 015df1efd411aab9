"""The uncovered parts across context and concurrency, and the prefills priced from the other
levels: every expectation computed by hand in the comments beside it."""

from __future__ import annotations

import pytest

from k25exp.report import context_model as CM

# a part that is exactly a + b·c + e·c·ctx: 0.5 ms + 0.01 ms per sequence + 0.1 µs per
# sequence·token of context
A, B, E = 0.5, 0.01, 1e-4


def part(c, ctx):
    return A + B * c + E * c * ctx


def test_a_part_linear_in_c_and_c_times_context_is_recovered_and_predicted_held_out():
    # profiled at contexts 160 and 544 (128 / 512 prompts + 64 / 2), c = 1 and 16
    pts = [(c, x, part(c, x)) for x in (160, 544) for c in (1, 16)]
    f = CM.fit("attention", pts)
    assert f.columns == ("1", "c", "c·ctx") and f.n == 4
    assert f.coef == pytest.approx((A, B, E))
    assert f.residual_max == pytest.approx(0, abs=1e-12)
    # held out in both: a context never profiled (1568: a 1536 prompt), at c = 4
    # 0.5 + 0.04 + 1e-4 × 4 × 1568 = 0.54 + 0.6272 = 1.1672 ms
    assert f.at(4, 1568) == pytest.approx(1.1672)


def test_columns_the_points_do_not_span_are_left_out():
    # every profile at c = 1: the c column is the constant one; a + e·ctx remains
    # (1, 160) → 0.5 + 0.01 + 0.016 = 0.526; (1, 544) → 0.5 + 0.01 + 0.0544 = 0.5644
    f = CM.fit("attention", [(1, 160, 0.526), (1, 544, 0.5644)])
    assert f.columns == ("1", "c·ctx")
    # 0.5644 − 0.526 = e × 384 → e = 1e-4; a = 0.526 − 0.016 = 0.51
    assert f.coef == pytest.approx((0.51, 1e-4))
    assert f.formula == "a + e·c·ctx"
    # one context: c·ctx is c × 160, dependent on c; a + b·c through two points
    f = CM.fit("idle", [(1, 160, 1.0), (16, 160, 2.5)])
    assert f.columns == ("1", "c")
    assert f.coef == pytest.approx((0.9, 0.1))  # b = 1.5 / 15, a = 1.0 − 0.1
    with pytest.raises(ValueError, match="fit 'x': no profiled point has it"):
        CM.fit("x", [])


def test_a_least_squares_fit_over_more_points_than_columns():
    # three contexts at c = 1, 16: y = part + 0.03 at (1568, 16), − 0.03 at (1568, 1)
    pts = [(c, x, part(c, x)) for x in (160, 544) for c in (1, 16)]
    pts += [(16, 1568, part(16, 1568) + 0.03), (1, 1568, part(1, 1568) - 0.03)]
    f = CM.fit("attention", pts)
    assert f.n == 6 and f.residual_max > 0
    # the off-model ±0.03 is spread over the fit: no point is off by more than it
    assert f.residual_max < 0.03


def test_uncovered_fits_every_part_over_every_profiled_point():
    points = {(x, c): {"attention": part(c, x), "idle": 1.0 + 0.05 * c, "wait": None}
              for x in (160, 544) for c in (1, 16)}
    points[(160, 1)]["wait"] = 0.2  # one profile measured the wait: its fit has one point
    unc = CM.Uncovered(points)
    assert unc.contexts == [160, 544] and unc.parts == ["attention", "idle", "wait"]
    got, how = unc.at(4, 1568)
    assert got["attention"] == pytest.approx(1.1672)
    assert got["idle"] == pytest.approx(1.2)  # 1 + 0.05 × 4
    assert got["wait"] == pytest.approx(0.2)  # one point: the constant alone
    assert unc.fits["wait"].columns == ("1",)
    assert how == "fit over 4 profiled points (a + b·c + e·c·ctx); wait: 1 point, a"


def test_profiles_of_one_context_fall_back_to_interpolation_in_c():
    points = {(160, 1): {"attention": 1.0}, (160, 16): {"attention": 2.5}}
    unc = CM.Uncovered(points)
    assert unc.fits == {}
    got, how = unc.at(4, 160)  # 1 + (4 − 1) / 15 × 1.5 = 1.3
    assert got == {"attention": pytest.approx(1.3)} and how == "interpolated in c"
    got, how = unc.at(32, 544)  # held at c = 16, and at the one profiled context
    assert got == {"attention": 2.5}
    assert how == "held at c=16; context held at the one profiled (160 tokens)"
    got, how = CM.Uncovered({}).at(4, 160)  # no profile: missing, never 0 ms
    assert got == {"profiles": None}


def test_prefills_are_priced_from_the_other_levels_of_the_shape():
    # the levels' own slopes: c = 4 20 µs over 16 requests, c = 16 30 µs over 64
    slopes = {4: (20.0, 16.0), 16: (30.0, 64.0)}
    profiled = {1: 80.0, 16: 50.0}  # the profiles' prefill steps, µs per token
    # c = 16: 10 tokens per step × c = 4's 20 µs = 0.2 ms (its own 30 µs is not used)
    ms, how, note = CM.prefill_priced(16, 10.0, slopes, profiled)
    assert ms == pytest.approx(0.2) and how == "other levels"
    assert note == ("prefills shared: 10.0 prompt tokens per step × 20.00 µs, the other levels' "
                    "own slopes at this shape, weighted by their requests: c=4 20.00 µs (n=16)")
    # c = 8 (no slope of its own): (20 × 16 + 30 × 64) / 80 = 28 µs × 5 tokens = 0.14 ms
    ms, _, _ = CM.prefill_priced(8, 5.0, slopes, profiled)
    assert ms == pytest.approx(0.14)
    # no other level has a slope: the profiles' prefill steps at c, interpolated
    # (80 + (4 − 1) / 15 × (50 − 80) = 74 µs) × 5 tokens = 0.37 ms
    ms, how, note = CM.prefill_priced(4, 5.0, {4: (20.0, 16.0)}, profiled)
    assert ms == pytest.approx(0.37) and how == "profiles' prefill steps"
    assert "which read high" in note
    assert CM.prefill_priced(1, 0.0, {}, {})[:2] == (0.0, "none shared")
    assert CM.prefill_priced(4, 5.0, {}, {})[0] is None  # nothing to price it with: missing
    assert CM.prefill_priced(4, None, slopes, profiled)[0] is None  # an older run
    # a negative mean slope (noise around 0) counts 0 ms
    assert CM.prefill_priced(16, 10.0, {4: (-3.0, 16.0)}, {})[0] == 0.0
