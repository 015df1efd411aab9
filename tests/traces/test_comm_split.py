"""Wait / transport split of collective calls across ranks, on hand-built traces whose
arrivals are known: every expected figure below is worked out by hand in the comments."""

from __future__ import annotations

import csv

import pytest

from k25exp.traces import analyze, summary_text, write_outputs
from tests.traces.builders import DECODE, ev, op, rank_meta, step, write_trace

AR_OUTER, AR = "vllm::all_reduce", "_C::shm_allreduce"
AG = "_C::shm_all_gather"
NCCL_AR = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL"
SPLIT_KEYS = {"share_comm_wait", "share_comm_transport", "comm_wait_ms_per_step",
              "comm_transport_ms_per_step", "comm_raw_ms_per_step", "comm_calls_matched",
              "comm_calls_unmatched"}


def _write(tmp_path, rank: int, events: list[dict], base_ns: int | None = None):
    """A CPU trace of `rank`. With base_ns, written as Kineto does: ts relative to
    baseTimeNanoseconds (the events keep their absolute time)."""
    meta = rank_meta(rank)
    if base_ns is not None:
        meta["baseTimeNanoseconds"] = base_ns
        for e in events:
            e["ts"] -= base_ns / 1000
    return write_trace(tmp_path / f"worker.rank{rank}.pt.trace.json.gz", events, meta)


def _three_steps(rank: int) -> list[dict]:
    """Steps [0,200), [200,400), [400,600) µs. Per step (offset o), both ranks end each call
    at the same time:
      all-reduce #1  vllm::all_reduce > _C::shm_allreduce (nested: one call)
                     rank0 [o+10, o+40), rank1 [o+20, o+40)
      all-reduce #2  rank0 [o+100, o+150), rank1 [o+130, o+150); in step 2 the other way
                     round: rank0 [o+130, o+150), rank1 [o+100, o+150)
      all-gather     rank0 [o+160, o+180), rank1 [o+155, o+180)
    and a GEMM [o+50, o+90) on both."""
    events = []
    for i in range(3):
        o = 200.0 * i
        events.append(step(DECODE, o, 200))
        if rank == 0:
            events += [op(AR_OUTER, o + 10, 30), op(AR, o + 12, 26)]
            ar2 = (o + 130, 20) if i == 2 else (o + 100, 50)
            events += [op(AR, *ar2), op(AG, o + 160, 20)]
        else:
            events += [op(AR_OUTER, o + 20, 20), op(AR, o + 21, 18)]
            ar2 = (o + 100, 50) if i == 2 else (o + 130, 20)
            events += [op(AR, *ar2), op(AG, o + 155, 25)]
        events.append(op("aten::mm", o + 50, 40))
    return events


def test_two_ranks_wait_and_transport_by_hand(tmp_path):
    # rank 1's trace is written relative to a baseTimeNanoseconds of its own: the split
    # only comes out right if the reader's absolute clock is recovered
    paths = [_write(tmp_path, 0, _three_steps(0)),
             _write(tmp_path, 1, _three_steps(1), base_ns=1_790_000_000_000_000)]
    a = analyze(paths)
    r0, r1 = a.ranks
    assert a.comm_split.steps_matched == 3 and not a.all_warnings() and not a.notes
    # last arrivals: AR#1 o+20, AR#2 o+130 (step 2: o+130 too), AG o+160
    # rank0 wait: AR#1 10 + AR#2 30 (steps 0, 1) / 0 (step 2); AG 0  -> 40+40+10 = 90 µs
    #   transport: AR#1 20 + AR#2 20, AG 20 per step                  -> 3*60    = 180 µs
    # rank1 wait: AR#1 0, AR#2 0 / 30 (step 2), AG 5 per step         -> 30 + 15 = 45 µs
    #   transport: 20 + 20 + 20 per step                              -> 180 µs
    # raw: rank0 (30+50+20)*2 + (30+20+20) = 270; rank1 (20+20+25)*2 + (20+50+25) = 225
    # of 600 µs of steps
    m0, m1 = r0.metrics(), r1.metrics()
    assert m0["share_comm_wait"] == pytest.approx(15.0)
    assert m0["share_comm_transport"] == pytest.approx(30.0)
    assert m1["share_comm_wait"] == pytest.approx(7.5)
    assert m1["share_comm_transport"] == pytest.approx(30.0)
    assert (m0["comm_wait_ms_per_step"], m0["comm_transport_ms_per_step"],
            m0["comm_raw_ms_per_step"]) == pytest.approx((0.030, 0.060, 0.090))
    assert (m1["comm_wait_ms_per_step"], m1["comm_transport_ms_per_step"],
            m1["comm_raw_ms_per_step"]) == pytest.approx((0.015, 0.060, 0.075))
    assert m0["comm_calls_matched"] == m1["comm_calls_matched"] == 9
    assert m0["comm_calls_unmatched"] == m1["comm_calls_unmatched"] == 0
    # per step (ns), rank0: AR wait 40, 40, 10; rank1: AG wait 5 each step
    ar, ag = r0.categories.index("comm_allreduce"), r0.categories.index("comm_allgather")
    assert r0.comm_split.wait_ns[:, ar].tolist() == [40_000, 40_000, 10_000]
    assert r0.comm_split.wait_ns[:, ag].tolist() == [0, 0, 0]
    assert r1.comm_split.wait_ns[:, ar].tolist() == [0, 0, 30_000]
    assert r1.comm_split.wait_ns[:, ag].tolist() == [5_000, 5_000, 5_000]
    assert r1.comm_split.transport_ns[:, ag].tolist() == [20_000, 20_000, 20_000]
    assert r0.comm_split.calls_matched[ar] == 6 and r0.comm_split.calls_matched[ag] == 3
    # across ranks: mean headline, then min / median / max
    m = a.metrics()
    assert m["share_comm_wait"] == pytest.approx(11.25)
    assert (m["share_comm_wait_min"], m["share_comm_wait_median"], m["share_comm_wait_max"]) \
        == pytest.approx((7.5, 11.25, 15.0))
    assert m["share_comm_transport_max"] == pytest.approx(30.0)
    assert m["comm_calls_matched"] == 9
    # the exposed share is unchanged: self time of the comm ops; rank0 per step
    # 30 + 50|20 + 20 µs (the outer op's own time counts as all-reduce too)
    assert m0["share_communication"] == pytest.approx(100 * 270 / 600)

    out = tmp_path / "out"
    assert write_outputs(a, out, plots=False) == m
    table = {row["category"]: row for row in csv.DictReader(open(out / "breakdown.csv"))}
    assert float(table["[comm_wait]"]["rank0"]) == pytest.approx(15.0)
    assert float(table["[comm_transport]"]["rank1"]) == pytest.approx(30.0)
    assert float(table["comm_wait_ms"]["max"]) == pytest.approx(0.030)
    assert float(table["comm_raw_ms"]["rank1"]) == pytest.approx(0.075)
    assert "[comm_wait]" in summary_text(a)
    steps = list(csv.DictReader(open(out / "steps_rank0.csv")))
    assert [float(s["comm_wait_us"]) for s in steps] == pytest.approx([40, 40, 10])
    assert [float(s["comm_transport_us"]) for s in steps] == pytest.approx([60, 60, 60])
    d = a.to_dict()["ranks"][1]["comm_split"]["by_category"]
    assert d["comm_allgather"]["wait_ms_per_step"] == pytest.approx(0.005)
    assert d["comm_allreduce"]["calls_matched"] == 6


def test_unequal_call_counts_match_by_order_and_warn(tmp_path):
    # one step [0,200); rank0 makes three all-reduces, rank1 two:
    #   #1 rank0 [10,20)  rank1 [15,20)  -> last 15: rank0 wait 5, transport 5; rank1 0, 5
    #   #2 rank0 [50,60)  rank1 [55,60)  -> the same
    #   #3 rank0 [100,110), unmatched
    r0 = [step(DECODE, 0, 200), op(AR, 10, 10), op(AR, 50, 10), op(AR, 100, 10)]
    r1 = [step(DECODE, 0, 200), op(AR, 15, 5), op(AR, 55, 5)]
    a = analyze([_write(tmp_path, 0, r0), _write(tmp_path, 1, r1)])
    m0, m1 = a.ranks[0].metrics(), a.ranks[1].metrics()
    assert (m0["comm_calls_matched"], m0["comm_calls_unmatched"]) == (2, 1)
    assert (m1["comm_calls_matched"], m1["comm_calls_unmatched"]) == (2, 0)
    assert m0["comm_wait_ms_per_step"] == pytest.approx(0.010)
    assert m0["comm_transport_ms_per_step"] == pytest.approx(0.010)
    assert m1["comm_wait_ms_per_step"] == pytest.approx(0.0)
    assert m1["comm_transport_ms_per_step"] == pytest.approx(0.010)
    assert m0["share_comm_wait"] == pytest.approx(5.0)   # 10 of 200 µs
    assert any("different numbers of calls" in w and "rank0 1" in w for w in a.warnings)


def test_a_rank_whose_profiler_started_a_step_late(tmp_path):
    # rank0 has steps at 0, 200, 400 µs; rank1 only the last two (same names). Per step an
    # all-reduce rank0 [o+10, o+30), rank1 [o+20, o+30): rank0 wait 10, transport 10;
    # rank1 wait 0, transport 10. rank0's first step has no partner: its call is unmatched.
    def events(rank, first):
        ev_ = []
        for i in range(first, 3):
            o = 200.0 * i
            ev_ += [step(DECODE, o, 200), op(AR, o + 10 * (rank + 1), 20 - 10 * rank)]
        return ev_
    a = analyze([_write(tmp_path, 0, events(0, 0)), _write(tmp_path, 1, events(1, 1))])
    assert a.comm_split.steps_matched == 2
    m0, m1 = a.ranks[0].metrics(), a.ranks[1].metrics()
    assert (m0["comm_calls_matched"], m0["comm_calls_unmatched"]) == (2, 1)
    # the split covers the two matched steps (400 µs) on both ranks, not rank0's third step:
    # rank0 20 µs of wait in them (10 per step); rank1 0 wait, 20 µs transport
    assert m0["share_comm_wait"] == pytest.approx(100 * 20 / 400)
    assert m0["comm_wait_ms_per_step"] == pytest.approx(0.010)
    assert (m1["share_comm_wait"], m1["share_comm_transport"]) == pytest.approx((0.0, 5.0))
    # coverage: rank0 2 of 3 analysed steps, 2 of its 3 calls split; rank1 all
    assert (m0["comm_steps_matched"], m0["comm_steps_matched_pct"]) == pytest.approx((2, 100 * 2 / 3))
    assert (m0["comm_calls"], m0["comm_calls_split_pct"]) == pytest.approx((3, 100 * 2 / 3))
    assert (m1["comm_steps_matched_pct"], m1["comm_calls_split_pct"]) == (100.0, 100.0)
    assert any("1 of 3 steps of rank0 have no partner" in w for w in a.warnings)


def test_clocks_that_disagree_leave_calls_unsplit_with_one_warning(tmp_path):
    # two all-reduces in one step: #1 rank0 [10,20) ends before rank1 arrives at 30: the
    # clocks disagree, so it is unsplittable on both; #2 rank0 [100,120), rank1 [110,120)
    r0 = [step(DECODE, 0, 200), op(AR, 10, 10), op(AR, 100, 20)]
    r1 = [step(DECODE, 0, 200), op(AR, 30, 10), op(AR, 110, 10)]
    a = analyze([_write(tmp_path, 0, r0), _write(tmp_path, 1, r1)])
    s0, s1 = a.ranks[0].comm_split, a.ranks[1].comm_split
    assert s0.calls_unsplittable == s1.calls_unsplittable == 1
    assert s0.calls_matched.sum() == s1.calls_matched.sum() == 1
    m0 = a.ranks[0].metrics()
    assert (m0["comm_calls"], m0["comm_calls_unsplittable"], m0["comm_calls_split_pct"]) == (2, 1, 50.0)
    assert (s0.wait_ns.sum(), s0.transport_ns.sum(), s0.raw_ns.sum()) == (10_000, 10_000, 20_000)
    assert (s1.wait_ns.sum(), s1.transport_ns.sum(), s1.raw_ns.sum()) == (0, 10_000, 10_000)
    assert sum("clocks disagree" in w for w in a.warnings) == 1


def test_gpu_traces_split_kernels(tmp_path):
    # one device step [0,100); NCCL all-reduce kernel rank0 [40,60), rank1 [50,60)
    def trace(rank, start):
        return write_trace(tmp_path / f"gpu.rank{rank}.json",
                           [step(DECODE, 0, 100, device=True, ext=1),
                            ev(NCCL_AR, start, 60 - start)],
                           rank_meta(rank))
    a = analyze([trace(0, 40), trace(1, 50)])
    m0, m1 = a.ranks[0].metrics(), a.ranks[1].metrics()
    assert (m0["share_comm_wait"], m0["share_comm_transport"]) == pytest.approx((10.0, 10.0))
    assert (m1["share_comm_wait"], m1["share_comm_transport"]) == pytest.approx((0.0, 10.0))


def test_a_single_rank_has_no_split_and_says_why(tmp_path):
    a = analyze([_write(tmp_path, 0, _three_steps(0))])
    assert not SPLIT_KEYS & set(a.metrics()) and a.ranks[0].comm_split is None
    reason = "wait/transport split needs the traces of ≥ 2 ranks of one host; got 1"
    assert a.notes == [reason] and not a.warnings
    assert a.to_dict()["comm_split"]["reason"] == reason
    text = summary_text(a)
    assert f"# note: {reason}" in text and "[comm_wait]" not in text
    assert write_outputs(a, tmp_path / "out", plots=False) == a.metrics()
    assert "comm_wait_us" not in (tmp_path / "out" / "steps_rank0.csv").read_text()


def test_ranks_whose_steps_cannot_be_matched_have_no_split(tmp_path):
    # rank1 was captured an hour later: no step overlaps rank0's on the shared clock
    late = [step(DECODE, 3.6e9, 200), op(AR, 3.6e9 + 10, 10),
            step("execute_context_0(0)_generation_2(2)", 3.6e9 + 200, 200)]
    a = analyze([_write(tmp_path, 0, _three_steps(0)), _write(tmp_path, 1, late)])
    assert not SPLIT_KEYS & set(a.metrics())
    assert any("no step of rank1 overlaps a step of rank0" in w for w in a.warnings)


GEMM = "nvjet_tst_128x64_64x8_1x2_h_bz_coopA_NNT"


def _nccl_steps(rank: int, n_steps: int = 3) -> list[dict]:
    """n steps of a TP-2 decode on a GPU, 1000 µs apart (offset o). GEMM k (k = 0..5) runs
    on the compute stream (7) at [o+100k, o+100k+60); all-reduce k on NCCL's own stream (20)
    from o+100k+60 (rank1: +70) to o+100k+100. The device-side step annotation exists on the
    compute stream only and spans its GEMMs, [o, o+560): all-reduce 5 starts where it ends."""
    events = []
    for i in range(n_steps):
        o = 1000.0 * i
        events.append(step(DECODE, o, 560, device=True, ext=i + 1))
        for k in range(6):
            t = o + 100 * k
            events.append(ev(GEMM, t, 60, tid=7))
            a = t + 60 + 10 * rank
            events.append(ev(NCCL_AR, a, t + 100 - a, tid=20))
    return events


def test_every_collective_launched_in_a_gpu_step_counts_in_it(tmp_path):
    """A step's last all-reduce on NCCL's stream starts after the step's last compute kernel,
    where the device annotation of the compute stream ends: it was launched in that step and
    must count there (a held-out 2-GPU trace lost one all-reduce per step this way)."""
    paths = [write_trace(tmp_path / f"gpu.rank{r}.json", _nccl_steps(r), rank_meta(r)) for r in (0, 1)]
    a = analyze(paths)
    for r in a.ranks:
        counts = {k.name: k.calls for k in r.kernels}
        assert counts == {GEMM: 18, NCCL_AR: 18}  # 6 of each in each of 3 steps, by hand
        m = r.metrics()
        # matched + unmatched + unsplittable = the 18 kernels launched
        assert (m["comm_calls"], m["comm_calls_matched"], m["comm_calls_unmatched"],
                m["comm_calls_unsplittable"]) == (18, 18, 0, 0)
        # each step now ends with its last all-reduce: [o, o+600)
        assert [(s.start_ns // 1000, s.end_ns // 1000) for s in r.steps][0] == (0, 600)
        assert r.steps_grown == 3
    # per step, all-reduce k: last arrival rank1's t+70; rank0 waits 10 µs per call, 6 per
    # step: 60 µs wait; transport 30 µs per call: 180 µs. rank1: 0 wait, 180 transport
    m0, m1 = a.ranks[0].metrics(), a.ranks[1].metrics()
    assert (m0["comm_wait_ms_per_step"], m0["comm_transport_ms_per_step"]) == pytest.approx((0.060, 0.180))
    assert (m1["comm_wait_ms_per_step"], m1["comm_transport_ms_per_step"]) == pytest.approx((0.0, 0.180))
    # exposed: GEMMs 360 of 600 µs; the all-reduces after each GEMM 40 (rank0) per k = 240
    assert a.ranks[0].shares()["gemm_dense"] == pytest.approx(60.0)
    assert a.ranks[0].shares()["comm_allreduce"] == pytest.approx(40.0)
