"""gloo's collectives on hand-built CPU traces: the calling thread's c10d op only enqueues,
gloo's worker thread runs the collective (a `gloo:<op>` user annotation) while the caller
blocks unrecorded. Every expected figure is worked out by hand in the comments."""

from __future__ import annotations

import pytest

from k25exp.traces import analyze
from tests.traces.builders import DECODE, ev, op, rank_meta, step, write_trace

AR, AG = "c10d::allreduce_", "c10d::_allgather_base_"


def gloo(name: str, ts: float, dur: float, tid: int) -> dict:
    """A gloo worker thread's span of one collective (user_annotation, as torch records it)."""
    return ev(f"gloo:{name}", ts, dur, cat="user_annotation", pid=100, tid=tid,
              args={"External id": 1, "Record function id": 0})


def _rank(rank: int) -> list[dict]:
    """Two steps [0,1000), [1000,2000) µs, offset o. Per step on the main thread (tid 100):
      GEMM        [o+0,   o+100)
      all-reduce  c10d op [o+100, o+110) (rank1: [o+300, o+310)); gloo worker span
                  [o+105, o+500) on rank0, [o+305, o+500) on rank1 (both end at o+500)
      GEMM        [o+500, o+600)
      all-gather  c10d op [o+600, o+605) both; worker [o+602, o+700) rank0, [o+603, o+700)
      GEMM        [o+700, o+800)
    Worker spans alternate between gloo's two threads (tids 201, 202), as torch's do.
    Rank1 runs a CPU op [o+110, o+300) before its all-reduce (it arrives late)."""
    events = []
    for i in range(2):
        o = 1000.0 * i
        events.append(step(DECODE, o, 1000))
        events += [op("aten::mm", o, 100), op("aten::mm", o + 500, 100), op("aten::mm", o + 700, 100)]
        if rank == 0:
            events += [op(AR, o + 100, 10), gloo("all_reduce", o + 105, 395, 201)]
            events += [op(AG, o + 600, 5), gloo("all_gather", o + 602, 98, 202)]
        else:
            events += [op("aten::add", o + 110, 190)]
            events += [op(AR, o + 300, 10), gloo("all_reduce", o + 305, 195, 201)]
            events += [op(AG, o + 600, 5), gloo("all_gather", o + 603, 97, 202)]
    # a worker span before the first op (the profiler started mid-collective): unclaimed
    events.append(gloo("all_reduce", -50, 40, 201))
    return events


def test_the_blocked_caller_is_the_collective_not_idle(tmp_path):
    paths = [write_trace(tmp_path / f"w.rank{r}.pt.trace.json.gz", _rank(r), rank_meta(r))
             for r in (0, 1)]
    a = analyze(paths)
    r0, r1 = a.ranks
    # rank0 per step: all-reduce [100, 500) = 400, all-gather [600, 700) = 100; GEMMs 300;
    # idle 1000 - 800 = 200. Without the worker spans: 10 + 5 of comm, 685 idle.
    s0 = r0.shares()
    assert s0["comm_allreduce"] == pytest.approx(40.0)
    assert s0["comm_allgather"] == pytest.approx(10.0)
    assert s0["gemm_dense"] == pytest.approx(30.0) and s0["idle"] == pytest.approx(20.0)
    # rank1: all-reduce [300, 500) = 200, aten::add 190 (other), all-gather 100, GEMMs 300;
    # idle [100, 110) and [800, 1000) = 210
    s1 = r1.shares()
    assert s1["comm_allreduce"] == pytest.approx(20.0) and s1["idle"] == pytest.approx(21.0)
    # 2 calls per step per rank paired; the early span on each rank is unclaimed
    assert (r0.gloo_ext.paired, r0.gloo_ext.unclaimed) == (4, 1)
    assert any("1 gloo worker spans had no host collective" in w for w in r0.warnings)
    # split: last arrivals all-reduce o+300, all-gather o+600 (both ranks start their op there)
    # rank0 per step: wait 200 + 0, transport 200 + 100; rank1: wait 0 + 0, transport 200 + 100
    m0, m1 = r0.metrics(), r1.metrics()
    assert (m0["comm_wait_ms_per_step"], m0["comm_transport_ms_per_step"]) == pytest.approx((0.2, 0.3))
    assert (m1["comm_wait_ms_per_step"], m1["comm_transport_ms_per_step"]) == pytest.approx((0.0, 0.3))
    assert m0["comm_calls_matched"] == 4 and m0["comm_calls_unmatched"] == 0
    assert a.to_dict()["ranks"][0]["gloo"] == {"calls_extended": 4, "spans_unclaimed": 1}


def test_an_op_that_ran_no_gloo_work_keeps_its_span(tmp_path):
    """Two all-reduce ops, one worker span that starts after the second op: it belongs to the
    second (the first ran elsewhere, e.g. vLLM's shared-memory path), so the first keeps its own
    end."""
    events = [step(DECODE, 0, 1000), op(AR, 100, 10), op(AR, 300, 10),
              gloo("all_reduce", 305, 95, 201)]
    a = analyze([write_trace(tmp_path / "w.rank0.pt.trace.json.gz", events, rank_meta(0))])
    (r,) = a.ranks
    # all-reduce: [100, 110) + [300, 400) = 110 µs of 1000
    assert r.shares()["comm_allreduce"] == pytest.approx(11.0)
    assert (r.gloo_ext.paired, r.gloo_ext.unclaimed) == (1, 0)
