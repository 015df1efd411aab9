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


def test_pooled_repeats_count_their_client_processes_once():
    """Process 1 of 3 failed in both repeats: 3 processes sent the level, 2 failures seen (a
    count from the failures would read 4)."""
    reps = [{"records": [], "wall_s": 1.0, "cpu_s": 0.1, "loop_lag_ms": [0.1],
             "loop_lag_ms_by_process": [[0.1], [0.2]], "client_processes": 3,
             "client_failures": ["client process 1: exited"]} for _ in range(2)]
    p = pool(reps)
    assert p["client_processes"] == 3 and len(p["client_failures"]) == 2
    from k25exp.load.level_figures import level_figures

    f = level_figures([], 2.0, 0.2, [0.1], 1e9, loop_lag_by_process=p["loop_lag_ms_by_process"],
                      client_failures=p["client_failures"], client_processes=p["client_processes"])
    assert (f["client_processes"], f["client_failures"]) == (3.0, 2.0)


def test_spread_is_range_over_median_of_the_repeats_figures():
    s = spread([{"tpot_ms_p50": 10.0, "output_tok_s": 100.0}, {"tpot_ms_p50": 12.0, "output_tok_s": 90.0},
                {"tpot_ms_p50": 11.0}])
    assert s["repeats"] == 3.0
    assert (s["tpot_ms_p50_rep_min"], s["tpot_ms_p50_rep_max"]) == (10.0, 12.0)
    assert s["tpot_ms_p50_rep_spread_pct"] == pytest.approx(2 / 11 * 100)
    assert "output_tok_s_rep_min" not in s  # one repeat lacks it: no spread claimed
