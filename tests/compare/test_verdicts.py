"""The verdict on a figure (k25exp.compare.table.judge_pair, on hand-made figures and samples):
judged on the tested median, never on a level its run flagged invalid."""

import pytest

from k25exp.compare.resolve import Pair
from k25exp.compare.table import judge_pair
from k25exp.tracking.read import RunView

PAIR = Pair("macro", {}, RunView("a" * 32, "1", "macro", "FINISHED", 0),
            RunView("b" * 32, "1", "macro", "FINISHED", 1))


def test_a_mean_that_rose_while_the_median_fell_does_not_fail_the_gate():
    # 30 samples each: B's bulk 20 % faster, one huge outlier lifts B's mean above A's
    sa = [10.0 + 0.01 * i for i in range(30)]
    sb = [8.0 + 0.01 * i for i in range(29)] + [200.0]
    mean_a, mean_b = sum(sa) / 30, sum(sb) / 30
    assert mean_b > 1.1 * mean_a  # the mean went up by more than --fail-on
    rows = judge_pair(PAIR, {("itl_ms_mean", 1): mean_a, ("valid", 1): 1.0},
                      {("itl_ms_mean", 1): mean_b, ("valid", 1): 1.0},
                      {("itl_ms_mean", 1): sa}, {("itl_ms_mean", 1): sb}, "", 0.05, 10.0, 5.0)
    (row,) = [r for r in rows if r.metric == "itl_ms_mean"]
    assert row.significant and row.test.median_change_pct < -15  # the distribution moved down
    assert row.change_pct > 10 and not row.worse_beyond


def test_a_slower_median_fails_the_gate_unless_its_level_was_flagged_invalid():
    sa = [10.0 + 0.01 * i for i in range(30)]
    sb = [20.0 + 0.01 * i for i in range(30)]  # twice as slow
    fig = ("tpot_ms_p50", 16)
    ok = judge_pair(PAIR, {fig: 10.1, ("valid", 16): 1.0}, {fig: 20.1, ("valid", 16): 1.0},
                    {fig: sa}, {fig: sb}, "", 0.05, 10.0, 5.0)
    assert [r.worse_beyond for r in ok if r.metric == "tpot_ms_p50"] == [True]
    bad = judge_pair(PAIR, {fig: 10.1, ("valid", 16): 1.0}, {fig: 20.1, ("valid", 16): 0.0},
                     {fig: sa}, {fig: sb}, "", 0.05, 10.0, 5.0)
    (row,) = [r for r in bad if r.metric == "tpot_ms_p50"]
    assert row.significant is False and not row.worse_beyond
    assert "not judged: level flagged invalid in B" in row.note
    # the single-stream figures follow single_stream_valid
    single = judge_pair(PAIR, {("single_stream_tpot_ms", None): 10.1, ("single_stream_valid", None): 0.0},
                        {("single_stream_tpot_ms", None): 20.1, ("single_stream_valid", None): 0.0},
                        {("single_stream_tpot_ms", None): sa}, {("single_stream_tpot_ms", None): sb},
                        "", 0.05, 10.0, 5.0)
    assert "invalid in A and B" in [r for r in single if r.metric == "single_stream_tpot_ms"][0].note


def test_a_served_level_without_a_validity_flag_is_never_taken_for_valid():
    sa = [10.0 + 0.01 * i for i in range(30)]
    sb = [20.0 + 0.01 * i for i in range(30)]
    fig = ("tpot_ms_p50", 16)
    # A logged no `valid` at 16 (a run whose client health was not kept): nothing says its
    # figures measured the server, so the slower median does not fail the gate
    rows = judge_pair(PAIR, {fig: 10.1}, {fig: 20.1, ("valid", 16): 1.0},
                      {fig: sa}, {fig: sb}, "", 0.05, 10.0, 5.0)
    (row,) = [r for r in rows if r.metric == "tpot_ms_p50"]
    assert row.significant is False and not row.worse_beyond
    assert "not judged: validity unknown in A" in row.note
    # a GEMM run has no validity flag at all: its steps are judged as they are
    gemm = Pair("gemm", {}, RunView("c" * 32, "1", "gemm", "FINISHED", 0),
                RunView("d" * 32, "1", "gemm", "FINISHED", 1))
    fig = ("small/torch_bf16/latency_us", 8)
    rows = judge_pair(gemm, {fig: 10.1}, {fig: 20.1}, {fig: sa}, {fig: sb}, "", 0.05, 10.0, 5.0)
    assert rows[0].worse_beyond and "validity" not in rows[0].note


def test_holm_adjusts_over_every_test_of_the_compare_not_pair_by_pair():
    from k25exp.compare.table import judge_pairs

    # 4 vs 4 samples, fully separated: exact two-sided p = 2 / C(8, 4) = 2/70 ≈ 0.029 each
    sa, sb = [10.0, 11.0, 12.0, 13.0], [14.0, 15.0, 16.0, 17.0]
    fig = ("gate.tp2/torch_bf16/latency_us", 1)
    pairs = [Pair("gemm", {"experiment.kernels": k}, RunView(k * 32, "1", "gemm", "FINISHED", 0),
                  RunView(k.upper() * 32, "1", "gemm", "FINISHED", 1)) for k in ("x", "y")]
    inputs = [(p, {fig: 11.5}, {fig: 15.5}, {fig: sa}, {fig: list(sb)}, "") for p in pairs]
    rows = judge_pairs(inputs, 0.05, None, 5.0)
    # Holm over the compare's 2 tests: 2 × 2/70 = 4/70 ≈ 0.057 > 0.05 for both
    assert [r.p_adjusted for r in rows] == pytest.approx([4 / 70, 4 / 70])
    assert [r.significant for r in rows] == [False, False]
    # one pair alone is a compare of one test: 2/70 < 0.05
    (alone,) = judge_pair(pairs[0], *inputs[0][1:], 0.05, None, 5.0)
    assert alone.p_adjusted == pytest.approx(2 / 70) and alone.significant
