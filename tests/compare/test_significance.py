"""The statistics checked against values computed by hand, not against the helpers' own maths."""

from __future__ import annotations

import pytest

from k25exp.compare import directions
from k25exp.compare import significance as stats


def test_mann_whitney_fully_separated_samples():
    # a = 1,2,3 below b = 4,5,6: no pair with a > b, U_a = 0. Exact two-sided p: of the
    # C(6,3) = 20 equally likely rank splits exactly one gives U = 0, so p = 2 × 1/20.
    u, p = stats.mann_whitney([1, 2, 3], [4, 5, 6])
    assert u == 0 and p == pytest.approx(0.1)


def test_mann_whitney_interleaved_samples():
    # a = 1,3,5, b = 2,4,6,8: pairs with a > b: 3>2, 5>2, 5>4, so U_a = 3. Rank splits of
    # 3 + 4 with U ≤ 3 (partitions of u into ≤ 3 parts each ≤ 4): u=0:1, 1:1, 2:2, 3:3 → 7
    # of C(7,3) = 35; U's mean is 6, so p = 2 × 7/35 = 0.4.
    u, p = stats.mann_whitney([1, 3, 5], [2, 4, 6, 8])
    assert u == 3 and p == pytest.approx(0.4)


def test_holm_adjustment_by_hand():
    # sorted 0.01, 0.03, 0.04 × (3, 2, 1) = 0.03, 0.06, 0.04 → running max 0.03, 0.06, 0.06
    assert stats.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert stats.holm([0.9, 0.8]) == pytest.approx([1.0, 1.0])  # capped


def test_bootstrap_interval_of_constant_samples_is_the_change_itself():
    # every resample of [10]*5 has median 10, of [12]*5 median 12: +20 % exactly
    assert stats.bootstrap_median_change([10] * 5, [12] * 5) == pytest.approx((20.0, 20.0))


def test_bootstrap_is_repeatable_and_brackets_the_change():
    a, b = [10, 11, 9, 10.5, 9.5, 10.2], [12, 12.5, 11.8, 12.2, 13, 11.9]
    first = stats.bootstrap_median_change(a, b)
    assert first == stats.bootstrap_median_change(a, b)  # fixed seed
    # medians 10.1 and 12.1: +19.8 %, inside the interval
    assert first[0] <= (12.1 - 10.1) / 10.1 * 100 <= first[1]


def test_too_few_samples_are_not_tested():
    assert stats.compare_samples([1, 2], [3, 4, 5]) is None


@pytest.mark.parametrize("metric, better", [
    ("tpot_ms_p50", "lower"), ("single_stream_ttft_ms", "lower"), ("baseline/itl_ms_mean", "lower"),
    ("output_tok_s", "higher"), ("busbw_gbps", "higher"), ("gate_up.tp2/marlin/latency_us", "lower"),
    ("gate_up.tp2/marlin/speedup_vs_bf16", "higher"), ("burst_ms", "lower"), ("errors", "lower"),
    ("tokens_per_chunk", "unknown"), ("saturation_concurrency", "unknown"), ("tpot_gap_pct", "unknown"),
    # goodput and sessions (the new load shapes' figures)
    ("good_fraction", "higher"), ("good_session_fraction", "higher"), ("max_good_fraction", "higher"),
    ("goodput_req_s", "higher"), ("sessions_cut", "lower"), ("turn3_ttft_ms_p50", "lower"),
    ("ttft_sched_ms_p50", "lower"), ("input_len_mean", "unknown"), ("sessions_completed", "unknown"),
    ("achieved_rate_req_s", "unknown"),
])
def test_declared_directions(metric, better):
    assert directions.direction(metric)[0] == better


def test_unknown_direction_never_counts_as_worse():
    assert not directions.is_worse("tokens_per_chunk", 500.0)
    assert directions.is_worse("tpot_ms_p50", 1.0) and directions.is_worse("output_tok_s", -1.0)
