"""Breakdowns of hand-built traces whose answer is known exactly, across ranks, and the
written outputs."""

from __future__ import annotations

import csv
import json

import pytest

from k25exp.traces import TraceError, analyze, summary_text, write_outputs
from k25exp.traces.breakdown import IDLE
from tests.traces.builders import DECODE, PREFILL, ev, op, rank_meta, step, write_trace

AR = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL"
GEMM = "nvjet_tst_128x64_64x8_1x2_h_bz_TNT"
QGEMM = "void marlin::Marlin<(vllm::ScalarType)4, 256, 1, 8, 8, true>"
ATTN = "void flash::flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128, 64, 128, 4>>"


def _one(tmp_path, events, name="t.json", **kw):
    a = analyze([write_trace(tmp_path / name, events)], **kw)
    return a, a.ranks[0]


def _close(d: dict, expected: dict) -> None:
    for k, v in expected.items():
        assert d[k] == pytest.approx(v, abs=1e-9), k
    rest = {k: v for k, v in d.items() if k not in expected}
    assert all(v == pytest.approx(0, abs=1e-9) for v in rest.values()), rest


def test_overlapping_kernels_on_two_streams(tmp_path):
    # one 100 µs step; stream 7: gemm [10,50); stream 8: all-reduce [30,70)
    _, r = _one(tmp_path, [step(DECODE, 0, 100, device=True, ext=1),
                           ev(GEMM, 10, 40, tid=7), ev(AR, 30, 40, tid=8)])
    assert r.mode == "gpu" and r.step_source == "gpu_user_annotation" and r.steps_analysed == 1
    assert r.decode_step_ms == pytest.approx(0.1)
    # compute has priority: the all-reduce is exposed only on [50,70)
    _close(r.shares(), {"gemm_dense": 40, "comm_allreduce": 20, IDLE: 40})
    _close(r.raw_shares(), {"gemm_dense": 40, "comm_allreduce": 40})
    assert r.overlap_share == pytest.approx(20)
    assert sum(r.shares().values()) == pytest.approx(100)
    m = r.metrics()
    assert m["share_communication"] == pytest.approx(20) and m["allreduce_share"] == pytest.approx(20)
    assert m["share_gemm"] == pytest.approx(40) and m["share_idle"] == pytest.approx(40)


def test_same_category_on_two_streams_counts_once(tmp_path):
    _, r = _one(tmp_path, [step(DECODE, 0, 100, device=True),
                           ev(GEMM, 0, 60, tid=7), ev(GEMM, 20, 60, tid=8)])
    _close(r.shares(), {"gemm_dense": 80, IDLE: 20})
    assert r.overlap_share == pytest.approx(0)
    k = r.kernels[0]
    assert (k.name, k.calls, k.total_us) == (GEMM, 2, pytest.approx(120))  # per-kernel: summed


def test_nested_cpu_operators_count_by_self_time(tmp_path):
    # linear [10,60) > copy_ [12,20), addmm [20,55); shm_allreduce [60,90); python frames,
    # runtime calls and another thread's op are handled; step [0,100)
    events = [step(DECODE, 0, 100),
              op("aten::linear", 10, 50), op("aten::copy_", 12, 8), op("aten::addmm", 20, 35),
              op("_C::shm_allreduce", 60, 30),
              op("_C::cpu_fused_moe", 90, 5, tid=101),          # another thread
              ev("model.py(12): forward", 0, 100, cat="python_function", pid=100, tid=100)]
    _, r = _one(tmp_path, events)
    assert r.mode == "cpu" and r.step_source == "user_annotation"
    _close(r.shares(), {"gemm_dense": 7 + 35, "memory": 8, "comm_allreduce": 30, "moe": 5,
                        IDLE: 15})
    ks = {k.name: k for k in r.kernels}
    assert ks["aten::linear"].total_us == pytest.approx(7)
    assert ks["aten::addmm"].total_us == pytest.approx(35) and ks["aten::addmm"].calls == 1
    assert "model.py(12): forward" not in ks


def test_a_step_boundary_cuts_a_kernel(tmp_path):
    # steps [0,100) and [100,200); a kernel [90,130) straddles them; one starts before the
    # first step; one after the last
    events = [step(DECODE, 0, 100, device=True, ext=1), step(DECODE, 100, 100, device=True, ext=2),
              ev(QGEMM, 90, 40), ev(ATTN, -20, 30, tid=8), ev(AR, 195, 50, tid=9)]
    _, r = _one(tmp_path, events)
    assert r.steps_analysed == 2
    assert r.busy_ns[:, r.categories.index("gemm_quantized")].tolist() == [10_000, 30_000]
    assert r.busy_ns[:, r.categories.index("attention")].tolist() == [10_000, 0]
    assert r.busy_ns[:, r.categories.index("comm_allreduce")].tolist() == [0, 5_000]
    _close(r.shares(), {"gemm_quantized": 20, "attention": 5, "comm_allreduce": 2.5, IDLE: 72.5})
    ks = {k.name: k for k in r.kernels}
    assert ks[QGEMM].total_us == pytest.approx(40) and ks[QGEMM].calls == 1
    assert ks[ATTN].total_us == pytest.approx(10) and ks[ATTN].calls == 0  # started before
    assert ks[AR].total_us == pytest.approx(5) and ks[AR].calls == 1


def test_prefill_steps_are_left_out(tmp_path):
    events = [step(PREFILL, 0, 100, device=True, ext=1), step(DECODE, 100, 50, device=True, ext=2),
              ev(GEMM, 0, 100), ev(AR, 100, 25)]
    _, r = _one(tmp_path, events)
    assert (r.annotated_steps, r.decode_steps, r.steps_analysed) == (2, 1, 1)
    _close(r.shares(), {"comm_allreduce": 50, IDLE: 50})
    # ... but counted: one prefill step of 100 µs over PREFILL's 8 context tokens = 12.5 µs each
    m = r.metrics()
    assert m["prefill_steps"] == 1 and m["prefill_us_per_token"] == pytest.approx(100 / 8)


def test_prefill_cost_per_token_sums_every_prefill_step(tmp_path):
    """Two prefill steps (60 µs for 12 tokens, 40 µs for 4 tokens with 2 decoding beside):
    (60 + 40) / (12 + 4) = 6.25 µs per context token; a window without one has no figure."""
    events = [step("execute_context_2(12)_generation_0(0)", 0, 60, device=True, ext=1),
              step("execute_context_1(4)_generation_2(2)", 60, 40, device=True, ext=2),
              step(DECODE, 100, 50, device=True, ext=3), ev(GEMM, 0, 150)]
    _, r = _one(tmp_path, events)
    m = r.metrics()
    assert m["prefill_steps"] == 2 and m["prefill_us_per_token"] == pytest.approx(6.25)
    _, r = _one(tmp_path, [step(DECODE, 0, 50, device=True, ext=1), ev(GEMM, 0, 50)], name="d.json")
    assert "prefill_us_per_token" not in r.metrics()


def test_without_annotations_the_whole_window_with_a_warning(tmp_path):
    a, r = _one(tmp_path, [ev(GEMM, 0, 30), ev(AR, 50, 50, tid=8)])
    assert r.step_source == "window" and r.steps_analysed == 1
    assert r.decode_step_ms == pytest.approx(0.1)
    _close(r.shares(), {"gemm_dense": 30, "comm_allreduce": 50, IDLE: 20})
    assert any("no vLLM step annotations" in w for w in a.to_dict()["warnings"])


def test_memcpy_by_event_category_and_host_ops_ignored_on_gpu(tmp_path):
    events = [step(DECODE, 0, 100, device=True), ev("Memcpy HtoD (Pageable -> Device)", 0, 10,
                                                     cat="gpu_memcpy", tid=9),
              ev("Memset (Device)", 10, 5, cat="gpu_memset", tid=9), op("aten::mm", 0, 100)]
    _, r = _one(tmp_path, events)
    assert r.mode == "gpu"
    _close(r.shares(), {"memory": 15, IDLE: 85})


def test_max_steps(tmp_path):
    events = [step(DECODE, 100 * i, 100, device=True, ext=i) for i in range(5)]
    events += [ev(GEMM, 100 * i, 10 * (i + 1)) for i in range(5)]
    a, r = _one(tmp_path, events, max_steps=2)
    assert r.steps_analysed == 2 and r.decode_steps == 5
    assert r.shares()["gemm_dense"] == pytest.approx(15)
    assert a.to_dict()["max_steps"] == 2


def _rank_trace(tmp_path, rank: int, ar_us: float):
    events = [step(DECODE, 100 * i, 100, device=True, ext=i) for i in range(4)]
    for i in range(4):
        events += [ev(GEMM, 100 * i, 40), ev(AR, 100 * i + 40, ar_us)]
    return write_trace(tmp_path / f"worker.{rank}.pt.trace.json.gz", events, rank_meta(rank, 3))


def test_across_ranks(tmp_path):
    paths = [_rank_trace(tmp_path, 2, 30), _rank_trace(tmp_path, 0, 10), _rank_trace(tmp_path, 1, 20)]
    a = analyze(paths)
    assert [r.label for r in a.ranks] == ["rank0", "rank1", "rank2"]
    assert [r.shares()["comm_allreduce"] for r in a.ranks] == pytest.approx([10, 20, 30])
    m = a.metrics()
    assert m["allreduce_share"] == pytest.approx(20)
    assert (m["allreduce_share_min"], m["allreduce_share_median"], m["allreduce_share_max"]) == \
        pytest.approx((10, 20, 30))
    assert m["share_gemm"] == pytest.approx(40) and m["steps_analysed"] == 4
    assert m["decode_step_ms"] == pytest.approx(0.1)
    shares = [m[f"share_{c}"] for c in a.categories] + [m["share_idle"]]
    assert sum(shares) == pytest.approx(100)
    top = a.top_kernels()
    assert [(k.name, k.calls) for k, _ in top] == [(GEMM, 12), (AR, 12)]
    assert top[0][0].total_us == pytest.approx(3 * 4 * 40)
    assert top[0][1] == pytest.approx(40)                     # of all ranks' step time
    assert top[1][0].mean_us == pytest.approx(20)


def test_ranks_from_file_names_else_order(tmp_path):
    mk = lambda name: write_trace(tmp_path / name, [ev(GEMM, 0, 10)])  # noqa: E731
    a = analyze([mk("dp0_pp0_tp0_dcp0_ep0_rank1.123.pt.trace.json"),
                 mk("dp0_pp0_tp0_dcp0_ep0_rank0.123.pt.trace.json")])
    assert [(r.label, r.rank) for r in a.ranks] == [("rank0", 0), ("rank1", 1)]
    a = analyze([mk("b.json"), mk("a.json")])
    assert [r.path.split("/")[-1] for r in a.ranks] == ["b.json", "a.json"]
    assert any("order given" in w for w in a.warnings)


def test_bad_file_among_ranks_names_it(tmp_path):
    good = _rank_trace(tmp_path, 0, 10)
    bad = tmp_path / "rank1.json.gz"
    bad.write_bytes(good.read_bytes()[:200])
    with pytest.raises(TraceError, match=str(bad)):
        analyze([good, bad])


def test_write_outputs(tmp_path):
    paths = [_rank_trace(tmp_path, 0, 10), _rank_trace(tmp_path, 1, 20)]
    a = analyze(paths)
    out = tmp_path / "out"
    metrics = write_outputs(a, out)
    assert metrics == a.metrics()
    for f in ("trace_breakdown.json", "breakdown.txt", "breakdown.csv", "top_kernels.txt",
              "top_kernels.csv", "top_kernels_rank0.csv", "steps_rank0.csv", "steps_rank1.csv",
              "breakdown_rank0.png", "breakdown_rank1.png", "breakdown_ranks.png"):
        assert (out / f).stat().st_size > 0, f
    d = json.loads((out / "trace_breakdown.json").read_text())
    assert d["metrics"] == pytest.approx(metrics)
    assert [r["label"] for r in d["ranks"]] == ["rank0", "rank1"]
    assert d["ranks"][1]["shares"]["comm_allreduce"] == pytest.approx(20)
    assert d["top_kernels"][0]["name"] == GEMM
    with open(out / "top_kernels.csv") as f:
        rows = list(csv.DictReader(f))
    assert rows[0]["name"] == GEMM and rows[0]["category"] == "gemm_dense"
    assert float(rows[0]["calls"]) == 8 and float(rows[0]["share"]) == pytest.approx(40)
    with open(out / "steps_rank1.csv") as f:
        steps = list(csv.DictReader(f))
    assert len(steps) == 4 and float(steps[0]["comm_allreduce_us"]) == pytest.approx(20)
    text = (out / "breakdown.txt").read_text()
    assert "comm_allreduce" in text and "[communication]" in text
    json.dumps(a.to_dict())  # JSON-serialisable


def test_zero_length_work_is_an_error_naming_the_file(tmp_path):
    p = write_trace(tmp_path / "zero.json", [ev(GEMM, 10, 0), ev(AR, 10, 0)])
    with pytest.raises(TraceError, match=f"{p}: nothing to analyse"):
        analyze([p])


# --- device work of other kinds than CUDA's ---------------------------------------------

def test_mtia_device_events_count_as_device_work(tmp_path):
    # MTIA: host operators and runtime calls, device work as mtia_ccp_events on the device's
    # lane; no step annotations, so the window runs from the first to the last device event:
    # [10, 80) µs, of which a GEMM 30 µs and an RMSNorm 20 µs; idle 20 µs
    events = [op("aten::mm", 0, 100),
              ev("mtiaLaunchKernel", 2, 3, cat="mtia_runtime", pid=100, tid=100),
              ev("gemm_bf16_kernel", 10, 30, cat="mtia_ccp_events", pid=1, tid=3),
              ev("rms_norm_kernel", 60, 20, cat="mtia_ccp_events", pid=1, tid=3)]
    a, r = _one(tmp_path, events)
    assert r.mode == "gpu" and r.step_source == "window"
    assert r.decode_step_ms == pytest.approx(0.07)
    _close(r.shares(), {"gemm_dense": 300 / 7, "norm_activation": 200 / 7, IDLE: 200 / 7})
    d = a.to_dict()["ranks"][0]
    assert d["device_events"] == {"mtia_ccp_events": 2}
    assert not any("recognise" in w for w in a.all_warnings())


def test_unrecognised_event_kinds_are_named_not_dropped_in_silence(tmp_path):
    # 3 + 2 complete events of kinds the analyser does not know, beside one host operator
    events = [op("aten::mm", 0, 100)]
    events += [ev("matmul", 10 * i, 5, cat="acme_kernel", pid=1, tid=2) for i in range(3)]
    events += [ev("copy", 50 + 10 * i, 5, cat="acme_dma", pid=1, tid=2) for i in range(2)]
    a, r = _one(tmp_path, events)
    assert r.mode == "cpu"
    warning = [w for w in a.all_warnings() if "recognise" in w]
    assert warning == ["rank0: 5 complete events of kinds the analyser does not recognise were "
                       "not counted: acme_kernel (3), acme_dma (2); if they are device work, "
                       "this breakdown misses it (analysed as a CPU trace)"]
    assert a.to_dict()["ranks"][0]["unrecognised_events"] == {"acme_kernel": 3, "acme_dma": 2}
    assert warning[0] in summary_text(a)
