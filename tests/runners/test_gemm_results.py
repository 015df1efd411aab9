"""k25exp.runners.gemm_results: a timed point's figures from its latency and what it moves and
computes (hand-computed here), and how each figure was timed, kept as the run's tags."""

from __future__ import annotations

from types import SimpleNamespace

import orjson
import pytest

from k25exp.gemm.timing import Timing
from k25exp.runners.gemm_results import Samples, figures, timed_row
from k25exp.tracking import MemoryRecorder

# 100 GB/s, 10 TFLOP/s
CFG = SimpleNamespace(hardware=SimpleNamespace(mem_bandwidth_gbps=100.0, peak_bf16_tflops=10.0))


def test_a_timed_points_figures_follow_from_its_latency():
    t = Timing([10.0, 20.0, 30.0])  # median 20 us; 3 calls: too few for a p90
    flops = 2 * 8 * 256 * 512  # M = 8, N = 256, K = 512: 2,097,152
    r = timed_row(CFG, "small", 256, 512, "k", 8, t, nbytes=1000, flops=flops, base_us=40.0,
                  err=1e-3, note="why")
    assert (r.status, r.latency_us, r.latency_us_p90, r.note) == ("ok", 20.0, None, "why")
    assert r.tflops == pytest.approx(2_097_152 / 20 / 1e6)  # 0.1048576
    assert r.gbps == pytest.approx(0.05)  # 1000 B / 20 us
    # compute bound: 2,097,152 / 10e12 s = 0.2097152 us (the bytes take 0.01 us)
    assert r.roofline_pct == pytest.approx(0.2097152 / 20 * 100)
    assert r.speedup_vs_bf16 == 2.0
    assert figures(r) == {"latency_us": 20.0, "tflops": r.tflops, "gbps": r.gbps,
                          "roofline_pct": r.roofline_pct, "speedup_vs_bf16": 2.0,
                          "max_rel_err": 1e-3}


def test_without_a_baseline_point_there_is_no_speedup_and_ten_calls_give_a_p90():
    t = Timing([float(x) for x in range(1, 11)])
    r = timed_row(CFG, "moe.tp1", 2, 2, "k", 1, t, nbytes=1, flops=1, base_us=None, err=0.0)
    assert r.speedup_vs_bf16 is None and "speedup_vs_bf16" not in figures(r)
    assert r.latency_us_p90 == t.p90_us


def test_samples_keep_every_call_and_tag_only_what_was_timed_otherwise(tmp_path):
    rec = MemoryRecorder()
    s = Samples(tmp_path, rec)
    s.keep("a/k", 1, Timing([1.0, 2.0], {"timer": "t", "graph": "True", "device": "cpu"}))
    s.keep("a/k", 8, Timing([3.0], {"timer": "t", "graph": "True"}))  # timed alike: no tag
    s.keep("moe/ref", 1, Timing([4.0], {"timer": "t", "graph": "False"}))
    s.keep("a/k", 1, Timing([5.0], {"calls_per_graph": 7, "timer": "g"}), "latency_us_instream")
    s.keep("a/k", 8, Timing([6.0], {"timer": "other"}), "latency_us_instream")  # tagged once
    s.close()
    assert rec.tags == {"timing.timer": "t", "timing.graph": "True", "timing.moe/ref.graph": "False",
                        "timing.instream.timer": "g"}
    lines = [orjson.loads(x) for x in (tmp_path / "samples.jsonl").read_bytes().splitlines()]
    assert [(x["figure"], x["step"], x["samples_us"]) for x in lines] == [
        ("a/k/latency_us", 1, [1.0, 2.0]), ("a/k/latency_us", 8, [3.0]),
        ("moe/ref/latency_us", 1, [4.0]), ("a/k/latency_us_instream", 1, [5.0]),
        ("a/k/latency_us_instream", 8, [6.0])]
