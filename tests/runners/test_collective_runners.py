"""The three collective runners, called as plain functions on real gloo process groups.

No Hydra job and no MLflow here: the runner gets the typed config and a MemoryRecorder, and
every logged figure is checked against the raw samples the ranks wrote.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from k25exp import vllm_kernels
from k25exp.config.validate import to_typed
from k25exp.runners import runner_for
from k25exp.runners.allreduce_sweep import sizes
from k25exp.runners.collective import CollectiveFailed
from k25exp.stats import median
from k25exp.tracking import MemoryRecorder
from tests.conftest import compose_cfg, vllm_cpu_build


def run(tmp_path, *overrides, rec=None):
    cfg = to_typed(compose_cfg(*overrides), gpu_count=lambda: 0)
    rec = rec if rec is not None else MemoryRecorder()
    summary = runner_for(cfg.experiment)(cfg, tmp_path, rec)
    return cfg, rec, summary


def raw_queued(tmp_path, point):
    """Per-rep burst time as the slowest rank saw it, straight from the JSONL."""
    per_rank = []
    for f in sorted((tmp_path / "raw").glob("rank*.jsonl")):
        recs = [json.loads(line) for line in f.read_text().splitlines()]
        per_rank.append(next(r for r in recs if r["kind"] == "point" and r["point"] == point)["queued_s"])
    return [max(xs) for xs in zip(*per_rank)]


def one(rec, key, step=None):
    return rec.latest(key)[step]


@pytest.mark.e2e
def test_nccl_burst_figures_follow_from_raw_samples(tmp_path):
    # the seed campaign's burst (122 all-reduces of the layer message) through c10d
    cfg, rec, _ = run(tmp_path, "experiment=nccl_burst", "debug=quick", "experiment.tokens=2",
                      "experiment.reference_tpot_ms=20", "experiment.ops_per_step=122",
                      "experiment.communicator=torch")
    burst_ms = median(raw_queued(tmp_path, 0)) * 1e3
    assert one(rec, "burst_ms") == pytest.approx(burst_ms)
    assert one(rec, "queued_op_us") == pytest.approx(burst_ms * 1e3 / 122)
    algbw = 2 * 14336 / (one(rec, "queued_op_us") * 1e-6) / 1e9
    assert one(rec, "algbw_gbps") == pytest.approx(algbw)
    assert one(rec, "busbw_gbps") == pytest.approx(algbw * 2 * (2 - 1) / 2)
    assert one(rec, "decode_share") == pytest.approx(100 * burst_ms / 20)  # percent of TPOT
    assert one(rec, "op_us_p50") <= one(rec, "op_us_p99")
    assert "graph_burst_ms" not in {k for k, _, _ in rec.metrics}  # CPU: no CUDA graphs
    assert set(rec.latest("wrong").values()) == {0}
    assert rec.tags["backend"] == "gloo" and rec.tags["world_size"] == "2"
    assert "perf_counter_ns" in rec.tags["timing.timer"]
    # c10d's gloo ops give work handles: the burst is queued, waited for once
    assert "issued back to back, one wait/sync at the end" in rec.tags["timing.queued"]
    rows = list(csv.DictReader(open(tmp_path / "results.csv")))
    assert len(rows) == 1 and rows[0]["bytes/step"] == str(122 * 28672) and rows[0]["ops"] == "122"
    assert one(rec, "ops_per_step") == 122 and one(rec, "bytes_per_step") == 122 * 28672
    assert rec.tags["communicator"] == "torch" and rec.tags["communicator.impl"] == "torch.distributed (gloo)"
    assert (tmp_path / "plots" / "op_latency_hist.png").stat().st_size > 1000


@pytest.mark.e2e
def test_allreduce_sweep_logs_each_size_as_a_step(tmp_path):
    _, rec, summary = run(tmp_path, "experiment=allreduce_sweep", "debug=quick",
                          "experiment.min_bytes=1024", "experiment.factor=4",
                          "experiment.communicator=torch")
    steps = sorted(rec.latest("time_us"))
    assert steps == [1024, 4096, 16384]  # debug=quick keeps the first 3 sizes
    for i, b in enumerate(steps):
        t = median(raw_queued(tmp_path, i)) / 3 * 1e6  # bursts of iters=3 ops
        assert rec.latest("time_us")[b] == pytest.approx(t)
        assert rec.latest("algbw_gbps")[b] == pytest.approx(b / (t * 1e-6) / 1e9)
        assert rec.latest("wrong")[b] == 0
    assert summary["peak_busbw_gbps"] == pytest.approx(max(rec.latest("busbw_gbps").values()))
    assert len((tmp_path / "results.txt").read_text().splitlines()) == 2 + 3


def test_sizes_round_to_whole_elements():
    assert sizes(8, 64, 2, 2) == [8, 16, 32, 64]
    assert sizes(3, 40, 3, 2) == [2, 8, 26]  # 3, 9, 27 rounded down to bf16 elements


@pytest.mark.e2e
def test_all_to_all_knee_and_per_token_figures(tmp_path):
    cfg, rec, summary = run(tmp_path, "experiment=all_to_all", "experiment.warmup=1",
                            "experiment.ops_per_burst=3", "experiment.bursts=2",
                            "experiment.tokens_per_gpu=[1,2,4,8,64]", "model=tiny_kimi")
    lat = rec.latest("a2a_us")
    assert sorted(lat) == [1, 2, 4, 8, 64]
    for t, us in lat.items():
        assert rec.latest("a2a_us_per_token")[t] == pytest.approx(us / t)
        algbw = t * 4 * 512 * 2 / (us * 1e-6) / 1e9  # tokens × top-4 × hidden 512 × bf16
        assert rec.latest("busbw_gbps")[t] == pytest.approx(algbw / 2)
    # the knee by hand (knee_factor 1.5, knee_baseline_points 3): baseline = the median of the
    # latencies at 1, 2, 4 tokens/GPU, the middle one of three; the knee = the first of the
    # points after that window (8, 64) slower than 1.5 × baseline, else none
    baseline = sorted([lat[1], lat[2], lat[4]])[1]
    knee = 8 if lat[8] > 1.5 * baseline else 64 if lat[64] > 1.5 * baseline else None
    assert summary.get("knee_tokens_per_gpu") == knee
    if knee is None:
        assert rec.tags["knee"].startswith("none within the sweep")
    else:
        assert rec.tags["knee"] == str(knee)


@pytest.mark.e2e
def test_failed_run_logs_finished_points_then_raises(tmp_path):
    rec = MemoryRecorder()
    with pytest.raises(CollectiveFailed, match=r"rank 1 died at point 2 \(injected fault\); 2 of 3"):
        run(tmp_path, "experiment=allreduce_sweep", "debug=quick", "experiment.fault.kill_rank=1",
            "experiment.fault.at_point=2", "experiment.communicator=torch", rec=rec)
    assert sorted(rec.latest("time_us")) == [8, 16]
    assert len(list(csv.DictReader(open(tmp_path / "results.csv")))) == 2


@pytest.mark.e2e
def test_wrong_result_fails_naming_rank_and_size(tmp_path):
    with pytest.raises(CollectiveFailed, match=r"wrong all_reduce result on rank 0 at 14336 B"):
        run(tmp_path, "experiment=nccl_burst", "debug=quick", "experiment.fault.corrupt_rank=0",
            "experiment.communicator=torch")  # vLLM's communicator: test_step_collectives_through_...


@pytest.mark.vllm  # vLLM in every rank
def test_step_collectives_through_vllms_own_communicator(campaign_full):
    """vLLM's TP communicator on 2 CPU ranks (the CPU build's shared-memory all-reduce, the
    path its server runs): tiny_kimi's decode step at TP 2, each op's result checked on every
    rank against the sum / concatenation written out by hand in the worker. The session
    campaign's nccl_burst phase at 1 token is that run (communicator vllm by default on one
    node), as MLflow and its run folder hold it."""
    (run,) = [r for r in campaign_full.runs if r.data.tags.get("k25exp.experiment") == "nccl_burst"
              and r.data.params.get("experiment.tokens") == "1"]
    tags, m = run.data.tags, run.data.metrics
    assert run.data.params["experiment.communicator"] == "vllm" and tags["communicator"] == "vllm"
    # what vLLM picks for this CPU: its AVX-512 builds have the shared-memory all-reduce, its
    # AVX2 build has not (gloo through torch.distributed)
    build = vllm_cpu_build()  # the CPU's, or the suite's cap (K25EXP_TEST_CPU_ISA)
    assert tags["vllm.cpu_isa"] == build
    assert tags["communicator.impl"] == ("shm (vLLM _CPUSHMDistributed, _C::shm_allreduce)"
                                         if build in ("avx512", "avx512_bf16") else
                                         "torch.distributed (gloo) via vLLM")
    # vLLM's CPU ops return when done: its burst is not said to be queued
    assert "run one after another" in tags["timing.queued"] and "back to back" not in tags["timing.queued"]
    # 1 + 2 × 3 layers all-reduces of 512 × 2 B, 1 all-gather of 2 × 2048 × 2 B
    assert m["ops_per_step"] == 8 and m["bytes_per_step"] == 7 * 1024 + 8192
    assert m["wrong"] == 0
    out = Path(tags["k25exp.output_dir"])
    recs = [json.loads(x) for f in sorted((out / "raw").glob("rank*.jsonl"))
            for x in f.read_text().splitlines()]
    points = [r for r in recs if r["kind"] == "point"]
    assert len(points) == 2 and all(r["wrong"] == 0 and r["wrong_all_ranks"] == 0 for r in points)
    assert points[0]["sequence_ops"] == ["all_reduce"] * 7 + ["all_gather"]
    ar = median([max(a, b) for a, b in zip(*(r["queued_kind_s"]["all_reduce"] for r in points))])
    assert m["allreduce_ms_per_step"] == pytest.approx(ar * 1e3)
    # each burst split at each op's last arrival, by hand from the two ranks' marks
    assert "wait and transport" in tags["timing.queued"]
    r0, r1 = sorted(points, key=lambda r: r["rank"])
    waits, transports = [], []
    for b0, b1 in zip(r0["queued_marks_ns"], r1["queued_marks_ns"]):
        assert len(b0) == len(b1) == 8  # every op of the step, on both ranks
        w = t = 0
        for (s0, e0), (s1, e1) in zip(b0, b1):
            last = max(s0, s1)
            w += (last - s0) + (last - s1)
            t += (e0 - last) + (e1 - last)
        waits.append(w / 2 / 1e6)
        transports.append(t / 2 / 1e6)
    assert m["burst_wait_ms"] == pytest.approx(median(waits))
    assert m["burst_transport_ms"] == pytest.approx(median(transports))
    assert 0 < m["burst_transport_ms"] <= m["burst_ms"]
    # where each rank's time went: per thread name, CPU and run-queue wait per op of the
    # queued bursts (Linux schedstat), mean over the ranks, by hand from the raw records
    sched = {k: v for k, v in m.items() if k.startswith("sched.")}
    assert sched and "per op of the queued bursts" in tags["sched.per_op"]
    for r in (r0, r1):
        assert r["queued_sched_ops"] == len(r["queued_s"]) * 8
    for key, v in sched.items():
        name, what = key[len("sched."):].rsplit(".", 1)
        i = 0 if what == "cpu_us_per_op" else 1
        have = [r for r in (r0, r1) if name in r["queued_sched"]]  # names are [A-Za-z0-9_.-]
        want = sum(r["queued_sched"][name][i] / r["queued_sched_ops"] for r in have) / len(have) / 1e3
        assert v == pytest.approx(want) and v >= 0
    rows = list(csv.DictReader(open(out / "step_collectives.csv")))
    assert [r["name"] for r in rows][::7] == ["embedding", "logits"] and rows[-1]["bytes(S)"] == "8192"


@pytest.mark.e2e
@pytest.mark.vllm  # vLLM in every rank
def test_vllms_communicator_results_are_checked_too(tmp_path):
    pytest.importorskip("vllm")
    with pytest.raises(CollectiveFailed, match=r"wrong all_reduce result on rank 1 at 1024 B"):
        run(tmp_path, "experiment=nccl_burst", "debug=quick", "model=tiny_kimi",
            "experiment.communicator=vllm", "experiment.fault.corrupt_rank=1")


@pytest.mark.e2e
@pytest.mark.vllm  # vLLM in every rank
def test_vllms_avx2_build_in_every_rank_when_capped(tmp_path):
    """hardware.vllm_cpu_isa=avx2: on any x86 CPU with AVX2 (one with AVX-512 included) every
    rank loads vLLM's AVX2 build, as an AVX2-only CPU's would, so its communicator falls back
    to gloo; the step's results are still checked in every rank. A rank that imported
    `vllm._C` by hand would show the AVX-512 build here (and die with SIGILL on such a CPU)."""
    pytest.importorskip("vllm")
    if vllm_kernels.native_level() is None:
        pytest.skip("needs an x86 CPU with AVX2")
    cfg, rec, _ = run(tmp_path, "experiment=nccl_burst", "debug=quick", "model=tiny_kimi",
                      "experiment.communicator=vllm", "hardware.vllm_cpu_isa=avx2")
    ranks = [json.loads(f.read_text().splitlines()[0]) for f in sorted((tmp_path / "raw").glob("rank*.jsonl"))]
    assert [(r["rank"], r["vllm_cpu_isa"]) for r in ranks] == [(0, "avx2"), (1, "avx2")]
    assert rec.tags["vllm.cpu_isa"] == "avx2"
    assert rec.tags["communicator.impl"] == "torch.distributed (gloo) via vLLM"
    points = [json.loads(x) for x in (tmp_path / "raw" / "rank1.jsonl").read_text().splitlines()]
    points = [p for p in points if p["kind"] == "point"]
    assert points and all(p["wrong_all_ranks"] == 0 for p in points)
    assert set(rec.latest("wrong").values()) == {0}


def test_a_step_with_an_all_gather_counts_each_op_kind_with_its_own_bus_factor(tmp_path):
    """The step's bus bandwidth from hand-written rank files, replayed through the runner
    (no torchrun): nccl-tests' factors per op kind, 2(n − 1)/n for an all-reduce and
    (n − 1)/n for an all-gather, never the all-reduce's for the whole step."""
    from k25exp.runners.collective import replaying
    from k25exp.runners.nccl_burst import step_ops

    cfg = to_typed(compose_cfg("experiment=nccl_burst", "experiment.communicator=torch",
                               "experiment.tokens=1"), gpu_count=lambda: 0)
    ops = step_ops(cfg)
    # Kimi at TP 2, one token: 123 all-reduces of 7168 × 2 B, the logits all-gather of
    # 163840 / 2 × 2 B per rank, gathered on 2 ranks: 327,680 B
    assert [o.op for o in ops] == ["all_reduce"] * 123 + ["all_gather"]
    assert {o.nbytes for o in ops[:-1]} == {14336} and ops[-1].nbytes == 327680
    raw = tmp_path / "raw"
    raw.mkdir()
    for rank in (0, 1):
        env = {"kind": "env", "rank": rank, "world_size": 2, "backend": "gloo", "host": "h",
               "device": "cpu", "device_name": "cpu", "torch": "x", "threads": 1}
        point = {"kind": "point", "rank": rank, "point": 0, "label": 1, "numel": 7168,
                 "bytes": sum(o.nbytes for o in ops), "burst": len(ops),
                 "sequence_ops": [o.op for o in ops], "sequence_bytes": [o.nbytes for o in ops],
                 "queued_s": [0.001, 0.002, 0.003], "wrong": 0}
        (raw / f"rank{rank}.jsonl").write_text(json.dumps(env) + "\n" + json.dumps(point) + "\n")
    rec = MemoryRecorder()
    with replaying(), pytest.raises(CollectiveFailed):  # a replay is a killed launch
        runner_for(cfg.experiment)(cfg, tmp_path, rec)
    burst_s = 0.002  # the median burst
    bus_bytes = 123 * 14336 * 2 * (2 - 1) / 2 + 327680 * (2 - 1) / 2  # 1,927,168 B
    assert one(rec, "busbw_gbps") == pytest.approx(bus_bytes / burst_s / 1e9)
    assert one(rec, "algbw_gbps") == pytest.approx((123 * 14336 + 327680) / burst_s / 1e9)
