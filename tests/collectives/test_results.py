"""Aggregation of rank files, bandwidth definitions and the knee, on hand-built inputs."""

from __future__ import annotations

import json

import pytest

from k25exp.collectives.results import PointResult, bandwidths, bus_factor, find_knee, read_rank_files


def test_bus_factors_are_nccl_tests_definitions():
    assert bus_factor("all_reduce", 8) == pytest.approx(2 * 7 / 8)
    assert bus_factor("all_to_all", 8) == pytest.approx(7 / 8)
    assert bus_factor("all_reduce", 1) == 0
    algbw, busbw = bandwidths(14336, 10e-6, "all_reduce", 8)
    assert algbw == pytest.approx(1.4336)  # 14,336 B / 10 µs = 1.4336 GB/s (1e9 B/s)
    assert busbw == pytest.approx(1.4336 * 1.75)


def test_knee_is_first_point_above_factor_times_flat_baseline():
    tokens = [1, 2, 4, 8, 16, 32]
    assert find_knee(tokens, [20, 21, 19, 24, 50, 90], 1.5, 3) == 16
    assert find_knee(tokens, [20, 21, 19, 24, 25, 26], 1.5, 3) is None
    assert find_knee(tokens[:3], [20, 21, 19], 1.5, 3) is None  # nothing beyond the baseline


def _write(path, recs):
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))


def _point(rank, i, queued, blocking, wrong=0):
    return {"kind": "point", "rank": rank, "point": i, "label": 2 ** i, "numel": 4, "bytes": 8,
            "burst": 2, "queued_s": queued, "blocking_s": blocking, "wrong": wrong}


def test_samples_take_the_slowest_rank_and_skip_incomplete_points(tmp_path):
    env = [{"kind": "env", "rank": r, "world_size": 2} for r in (0, 1)]
    _write(tmp_path / "rank0.jsonl", [env[0], _point(0, 0, [1.0, 4.0], [0.1, 0.5]),
                                       _point(0, 1, [2.0], [0.2])])
    # rank 1 died while writing point 1: a torn line, then nothing
    (tmp_path / "rank1.jsonl").write_text(
        json.dumps(env[1]) + "\n" + json.dumps(_point(1, 0, [3.0, 2.0], [0.3, 0.4])) + "\n"
        + '{"kind": "point", "rank": 1, "poi')
    files = read_rank_files(tmp_path)
    assert files.world_size == 2 and files.incomplete_points == 1
    (p,) = files.points
    assert p.queued_s == [3.0, 4.0] and p.blocking_s == [0.3, 0.5]
    assert p.burst_ms == pytest.approx(3500.0)  # median of [3, 4] s
    assert p.queued_op_us == pytest.approx(3.5 / 2 * 1e6)


def test_wrong_elements_are_summed_with_detail(tmp_path):
    env = [{"kind": "env", "rank": r, "world_size": 2} for r in (0, 1)]
    bad = {**_point(1, 0, [1.0], [0.1], wrong=3), "first_wrong_index": 0, "got": 7.0, "expected": 6.0}
    _write(tmp_path / "rank0.jsonl", [env[0], _point(0, 0, [1.0], [0.1])])
    _write(tmp_path / "rank1.jsonl", [env[1], bad])
    (p,) = read_rank_files(tmp_path).points
    assert p.wrong == 3 and p.wrong_detail[0]["rank"] == 1


def test_graph_op_time_is_the_graph_burst_over_its_length():
    p = PointResult(index=0, label=1, nbytes=8, numel=4, burst=4, queued_s=[1.0], graph_s=[0.2, 0.4, 0.3])
    assert p.graph_burst_ms == pytest.approx(300.0) and p.graph_op_us == pytest.approx(0.3 / 4 * 1e6)
    assert PointResult(index=0, label=1, nbytes=8, numel=4, burst=4, queued_s=[1.0]).graph_op_us is None  # no CUDA


def test_a_burst_of_ops_that_return_when_done_splits_at_each_ops_last_arrival(tmp_path):
    """Two ranks, one burst of two ops, marks in ns on one host's clock, worked out by hand:
    op 0: rank 0 [0, 10], rank 1 [4, 12]: last arrival 4; waits 4 + 0, transports 6 + 8.
    op 1: rank 0 [10, 30], rank 1 [15, 28]: last arrival 15; waits 5 + 0, transports 15 + 13.
    Mean over the 2 ranks: wait (4 + 5) / 2 = 4.5 ns, transport (14 + 28) / 2 = 21 ns."""
    env = [{"kind": "env", "rank": r, "world_size": 2, "host": "h"} for r in (0, 1)]
    marks = {0: [[[0, 10], [10, 30]]], 1: [[[4, 12], [15, 28]]]}
    for r in (0, 1):
        _write(tmp_path / f"rank{r}.jsonl",
               [env[r], {**_point(r, 0, [30e-9], []), "queued_marks_ns": marks[r]}])
    (p,) = read_rank_files(tmp_path).points
    assert p.queued_split_s == [pytest.approx((4.5e-9, 21e-9))]
    assert p.burst_wait_ms == pytest.approx(4.5e-6) and p.burst_transport_ms == pytest.approx(21e-6)


def test_marks_of_ranks_on_two_hosts_are_not_compared(tmp_path):
    """Two hosts' clocks do not agree: no split, the whole burst stays the figure."""
    for r in (0, 1):
        _write(tmp_path / f"rank{r}.jsonl",
               [{"kind": "env", "rank": r, "world_size": 2, "host": f"h{r}"},
                {**_point(r, 0, [1.0], []), "queued_marks_ns": [[[0, 10]]]}])
    (p,) = read_rank_files(tmp_path).points
    assert p.queued_split_s is None and p.burst_transport_ms is None and p.burst_ms == 1000.0


def test_thread_time_per_op_is_the_mean_over_ranks(tmp_path):
    """Rank 0: its loop thread 4,000 ns CPU and 2,000 ns waiting over 2 ops; rank 1: 8,000 and
    0. Per op, mean over ranks: CPU (2 + 4) / 2 = 3 µs, wait (1 + 0) / 2 = 0.5 µs. A thread
    only rank 1 has is averaged over rank 1 alone."""
    scheds = {0: {"loop": [4000, 2000, 5]}, 1: {"loop": [8000, 0, 3], "extra": [2000, 2000, 1]}}
    for r in (0, 1):
        _write(tmp_path / f"rank{r}.jsonl",
               [{"kind": "env", "rank": r, "world_size": 2},
                {**_point(r, 0, [1.0], []), "queued_sched": scheds[r], "queued_sched_ops": 2}])
    (p,) = read_rank_files(tmp_path).points
    assert p.sched_us_per_op["loop"] == [pytest.approx(3.0), pytest.approx(0.5)]
    assert p.sched_us_per_op["extra"] == [pytest.approx(1.0), pytest.approx(1.0)]
