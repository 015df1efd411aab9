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
