"""The verdict on a figure (k25exp.compare.table.judge_pair, on hand-made figures and samples):
judged on the tested median, never on a level its run flagged invalid."""

from k25exp.compare.resolve import Pair
from k25exp.compare.table import judge_pair
from k25exp.report.sources import RunView

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
