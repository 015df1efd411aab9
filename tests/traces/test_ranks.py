"""Which ranks the given traces are (distributedInfo), and the caveat a partial set of a
job's ranks needs: its wait/transport split measures waiting for the last of the ranks
given, not the last of the job."""

from __future__ import annotations

import pytest

from k25exp.traces import analyze, summary_text
from tests.traces.builders import DECODE, ev, rank_meta, step, write_trace

AR = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL"
GEMM = "nvjet_tst_128x64_64x8_1x2_h_bz_TNT"


def _rank(tmp_path, rank: int, world: int, start_us: float):
    """Two 100 µs decode steps; per step a GEMM [0, 40) and an all-reduce starting at
    `start_us` and ending at 90 µs on every rank."""
    events = [step(DECODE, 100 * i, 100, device=True, ext=i) for i in range(2)]
    for i in range(2):
        events += [ev(GEMM, 100 * i, 40), ev(AR, 100 * i + start_us, 90 - start_us, tid=8)]
    return write_trace(tmp_path / f"w{rank}.json", events, rank_meta(rank, world))


def test_two_of_128_ranks_say_what_the_split_can_and_cannot_show(tmp_path):
    a = analyze([_rank(tmp_path, 0, 128, 40), _rank(tmp_path, 1, 128, 50)])
    # the split itself, by hand: the last of the two arrives at 50 µs; rank 0 waits 10 µs
    # of its 50 µs call, per step of 100 µs
    m = a.metrics()
    assert m["share_comm_wait_max"] == pytest.approx(10.0)
    assert (m["ranks_analysed"], m["world_size"]) == (2, 128)
    d = a.to_dict()
    assert d["rank_set"] == {"world_size": 128, "ranks": [0, 1], "complete": False}
    caveat = [w for w in a.warnings if "of 128 ranks" in w]
    assert caveat == [
        "partial set of ranks: 2 of 128 ranks (0, 1). The wait/transport split is only against "
        "the ranks given: wait is the time until the last of these 2 arrived, and time spent "
        "waiting for a rank not given counts as transport. Per-rank shares hold for the ranks "
        "given; the spread across ranks (min/median/max) is theirs, not the job's."]
    assert caveat[0] in summary_text(a)


def test_a_complete_set_has_no_caveat(tmp_path):
    a = analyze([_rank(tmp_path, 0, 2, 40), _rank(tmp_path, 1, 2, 50)])
    assert a.to_dict()["rank_set"] == {"world_size": 2, "ranks": [0, 1], "complete": True}
    assert not any("partial set" in w for w in a.all_warnings())
    assert (a.metrics()["ranks_analysed"], a.metrics()["world_size"]) == (2, 2)


def test_traces_of_different_world_sizes_are_named(tmp_path):
    a = analyze([_rank(tmp_path, 0, 8, 40), _rank(tmp_path, 1, 16, 50)])
    assert a.to_dict()["rank_set"]["world_size"] is None
    assert "world_size" not in a.metrics()
    assert ["traces disagree on distributedInfo.world_size (rank0: 8, rank1: 16): not one job?"] \
        == [w for w in a.warnings if "world_size" in w]


def test_one_rank_of_eight_is_in_the_metrics_with_no_caveat(tmp_path):
    a = analyze([_rank(tmp_path, 3, 8, 40)])
    assert a.to_dict()["rank_set"] == {"world_size": 8, "ranks": [3], "complete": False}
    assert (a.metrics()["ranks_analysed"], a.metrics()["world_size"]) == (1, 8)
    assert not a.warnings and a.notes == [
        "wait/transport split needs the traces of ≥ 2 ranks of one host; got 1"]


def test_the_caveat_names_long_runs_of_ranks_as_ranges():
    from k25exp.traces.ranks import rank_set

    labels = [f"rank{r}" for r in (0, 1, 2, 3, 5, 7, 8)]
    rs, warnings = rank_set(labels, [8, 7, 5, 3, 2, 1, 0], [16] * 7)
    assert rs.ranks == [0, 1, 2, 3, 5, 7, 8] and rs.complete is False
    assert warnings[0].startswith("partial set of ranks: 7 of 16 ranks (0-3, 5, 7, 8). ")
