"""Pooling repeats and their spread, on hand-made results."""

import pytest

from k25exp.load.repeats import pool, spread


def test_pool_concatenates_and_sums():
    a = {"records": [1, 2], "wall_s": 1.5, "cpu_s": 0.5, "loop_lag_ms": [0.1], "rate": 2.0, "due_s": [0, 1]}
    b = {"records": [3], "wall_s": 2.0, "cpu_s": 0.25, "loop_lag_ms": [0.2, 0.3], "rate": 2.0, "due_s": [0]}
    p = pool([a, b])
    assert p["records"] == [1, 2, 3] and p["loop_lag_ms"] == [0.1, 0.2, 0.3]
    assert (p["wall_s"], p["cpu_s"], p["rate"]) == (3.5, 0.75, 2.0)
    assert p["repeats"] == [a, b]  # each keeps its own schedule for the rate check
    assert pool([a]) is a


def test_spread_is_range_over_median_of_the_repeats_figures():
    s = spread([{"tpot_ms_p50": 10.0, "output_tok_s": 100.0}, {"tpot_ms_p50": 12.0, "output_tok_s": 90.0},
                {"tpot_ms_p50": 11.0}])
    assert s["repeats"] == 3.0
    assert (s["tpot_ms_p50_rep_min"], s["tpot_ms_p50_rep_max"]) == (10.0, 12.0)
    assert s["tpot_ms_p50_rep_spread_pct"] == pytest.approx(2 / 11 * 100)
    assert "output_tok_s_rep_min" not in s  # one repeat lacks it: no spread claimed
