"""The torchrun worker on a real gloo process group (2 ranks on this CPU)."""

from __future__ import annotations

import shlex

import pytest

from k25exp.collectives.launch import Topology, launch, rank_python, torchrun_argv
from k25exp.collectives.results import read_rank_files
from k25exp.collectives.spec import CollectiveSpec, Point

TOPO = Topology(nproc_per_node=2)


def spec(op, numels, **kw):
    pts = [Point(label=i, numel=n, burst=4, reps=2, blocking_iters=3) for i, n in enumerate(numels)]
    return CollectiveSpec(op=op, dtype=kw.pop("dtype", "bfloat16"), device="cpu", backend="gloo",
                          points=pts, warmup=1, pg_timeout_s=120, **kw)


@pytest.mark.e2e
@pytest.mark.parametrize("op", ["all_reduce", "all_to_all"])
@pytest.mark.parametrize("dtype", ["bfloat16", "int8"])
def test_real_collectives_check_exactly_and_record_every_sample(tmp_path, op, dtype):
    s = spec(op, [8, 4096], dtype=dtype)
    out = launch(s, TOPO, tmp_path, wall_limit_s=120)
    assert out.ok, out.log_tail
    files = read_rank_files(tmp_path)
    assert files.world_size == 2 and [e["rank"] for e in files.env] == [0, 1]
    assert len(files.points) == 2
    for p in files.points:
        assert p.wrong == 0
        assert len(p.queued_s) == 2 and len(p.blocking_s) == 3 and p.graph_s is None
        assert all(t > 0 for t in p.queued_s + p.blocking_s)
        assert p.nbytes == p.numel * (2 if dtype == "bfloat16" else 1)


@pytest.mark.e2e
def test_corrupted_result_is_caught_on_the_right_rank(tmp_path):
    out = launch(spec("all_reduce", [64, 128], fault_corrupt_rank=1), TOPO, tmp_path, wall_limit_s=120)
    assert out.returncode != 0
    files = read_rank_files(tmp_path)
    (p,) = files.points  # the run stops after the point whose check failed
    assert p.wrong == 1 and p.wrong_detail == [
        {"rank": 1, "wrong": 1, "first_wrong_index": 0, "got": 4.0, "expected": 3.0,
             "wrong_op": "all_reduce", "wrong_bytes": 128}]  # 1 × (1 + 2), plus 1


@pytest.mark.e2e
def test_dead_rank_keeps_finished_points(tmp_path):
    out = launch(spec("all_reduce", [8, 16, 32], fault_kill_rank=1, fault_at_point=2), TOPO,
                 tmp_path, wall_limit_s=120)
    assert out.returncode != 0 and not out.timed_out
    files = read_rank_files(tmp_path)
    assert [p.index for p in files.points] == [0, 1]
    assert files.faults == [{"kind": "fault", "rank": 1, "point": 2}]


def test_multinode_argv_uses_rendezvous():
    argv = torchrun_argv(Topology(nproc_per_node=4, nnodes=2, node_rank=1, rdzv_endpoint="n0:29500"),
                         "s.json", "out")
    assert {"--nnodes=2", "--node-rank=1", "--master-addr=n0", "--master-port=29500"} <= set(argv)
    assert "--standalone" not in argv
    assert "--standalone" in torchrun_argv(TOPO, "s.json", "out")


@pytest.mark.e2e
def test_k25exp_python_runs_torchrun_and_every_rank(tmp_path, monkeypatch):
    """$K25EXP_PYTHON (a wrapper, as numactl or nsys would be used) starts torchrun's agent and
    each rank itself: three invocations, the ranks with the worker's module and this spec."""
    calls = tmp_path / "calls.txt"
    wrapper = tmp_path / "python-wrapper"  # test helper: logs its arguments, then runs Python
    wrapper.write_text(f'#!/bin/sh\necho "$*" >> {shlex.quote(str(calls))}\n'
                       f'exec {shlex.quote(rank_python())} "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("K25EXP_PYTHON", str(wrapper))
    out = launch(spec("all_reduce", [8]), TOPO, tmp_path / "run", wall_limit_s=120)
    assert out.ok, out.log_tail
    lines = calls.read_text().splitlines()
    worker = f"-m k25exp.collectives.worker {tmp_path / 'run' / 'spec.json'} {tmp_path / 'run'}"
    assert len(lines) == 3 and lines[0].startswith("-m torch.distributed.run"), lines
    assert lines[1:] == [worker, worker], lines
    assert len(read_rank_files(tmp_path / "run").env) == 2


@pytest.mark.e2e
def test_hardware_env_reaches_every_rank(tmp_path):
    topo = Topology(nproc_per_node=2, env={"NCCL_P2P_DISABLE": "1"})
    assert launch(spec("all_reduce", [8]), topo, tmp_path, wall_limit_s=120).ok
    assert [e["nccl_env"].get("NCCL_P2P_DISABLE") for e in read_rank_files(tmp_path).env] == ["1", "1"]


@pytest.mark.e2e
@pytest.mark.cuda
def test_nccl_step_burst_eager_and_graph_on_one_gpu(tmp_path):
    """Kimi-K2's decode-step collectives at TP 8 sizes (124 ops), NCCL on one GPU, queued and
    replayed from a CUDA graph: every result checked, both timings recorded."""
    from k25exp.collectives.step import decode_step_ops

    ops = decode_step_ops(7168, 61, 163840, 8, 1, 2)
    assert len(ops) == 124
    pt = Point(label=1, numel=7168, burst=len(ops), reps=5, blocking_iters=len(ops),
               sequence=[[o.op, o.numel] for o in ops])
    s = CollectiveSpec(op="step", dtype="bfloat16", device="cuda", backend="nccl", points=[pt],
                       warmup=2, graph=True, pg_timeout_s=120)
    out = launch(s, Topology(nproc_per_node=1), tmp_path, wall_limit_s=300)
    assert out.ok, out.log_tail
    (p,) = read_rank_files(tmp_path).points
    assert p.wrong == 0 and len(p.queued_s) == 5 and len(p.graph_s) == 5
    # a replay skips 124 kernel launches from the host: faster than the queued eager burst
    assert 0 < p.graph_burst_ms < p.burst_ms
