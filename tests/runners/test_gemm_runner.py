"""The GEMM runner on the CPU: figures follow from latency and shape, the gate catches wrong kernels."""

from __future__ import annotations

import csv

import pytest

from k25exp.compare.samples import gemm_samples
from k25exp.config.validate import ConfigError, to_typed
from k25exp.runners.gemm import GemmFailed, m_sweep, run
from k25exp.tracking import MemoryRecorder
from tests.conftest import compose_cfg

SMALL = ["experiment=gemm", "experiment.shapes=[]", "+experiment.extra_shapes.small={n: 256, k: 512}",
         "experiment.m_values=[1,8]", "experiment.moe_concurrency=[]", "experiment.moe_kernels=[]", "experiment.calls=3",
         "experiment.warmup=1"]


def typed(*overrides):
    return to_typed(compose_cfg(*overrides), gpu_count=lambda: 0)


def test_figures_follow_from_latency_and_shape(tmp_path):
    cfg = typed(*SMALL, "experiment.kernels=[torch_bf16,torch_int4,marlin]")
    rec = MemoryRecorder()
    run(cfg, tmp_path, rec)
    hw = cfg.hardware
    for m in (1, 8):
        lat = rec.latest("small/torch_int4/latency_us")[m]
        base = rec.latest("small/torch_bf16/latency_us")[m]
        nbytes = 256 * 512 // 2 + 256 * (512 // 32) * 4 + 2 * m * (512 + 256)  # int4 + scale&zero + x + y
        flops = 2 * m * 256 * 512
        assert rec.latest("small/torch_int4/gbps")[m] == pytest.approx(nbytes / lat / 1e3)
        assert rec.latest("small/torch_int4/tflops")[m] == pytest.approx(flops / lat / 1e6)
        assert rec.latest("small/torch_int4/speedup_vs_bf16")[m] == pytest.approx(base / lat)
        bound = max(nbytes / (hw.mem_bandwidth_gbps * 1e9), flops / (hw.peak_bf16_tflops * 1e12)) * 1e6
        assert rec.latest("small/torch_int4/roofline_pct")[m] == pytest.approx(bound / lat * 100)
        assert m not in rec.latest("small/torch_int4/latency_us_p90")  # 3 calls: no p90
        assert rec.latest("small/torch_int4/max_rel_err")[m] < 2e-2
    assert "vLLM with CUDA is not importable" in rec.tags["skipped.marlin"]
    rows = list(csv.DictReader(open(tmp_path / "results.csv")))
    assert {(r["kernel"], r["status"]) for r in rows} == {
        ("torch_bf16", "ok"), ("torch_int4", "ok"), ("marlin", "skipped")}
    assert rec.tags["timing.timer"] == "perf_counter_ns" and rec.tags["timing.threads"]
    # roofline_pct divides by the config's constants: each named with its source (nominal)
    assert rec.tags["roofline.mem_bandwidth_gbps"] == \
        f"{hw.mem_bandwidth_gbps:g} GB/s ({hw.mem_bandwidth_gbps_source})"
    assert rec.tags["roofline.peak_bf16_tflops"] == \
        f"{hw.peak_bf16_tflops:g} TFLOP/s ({hw.peak_bf16_tflops_source})"
    assert "roofline vs nominal" in (tmp_path / "results.txt").read_text()
    assert (tmp_path / "plots" / "latency_small.png").exists()
    # every timed call is kept for `k25exp compare`, and the logged median is theirs
    kept = gemm_samples(tmp_path / "samples.jsonl")
    assert set(kept) == {(f"small/{k}/latency_us", m) for k in ("torch_bf16", "torch_int4") for m in (1, 8)}
    for (fig, m), xs in kept.items():
        assert len(xs) == 3  # experiment.calls
        assert rec.latest(fig)[m] == pytest.approx(sorted(xs)[1])  # the median of 3, by hand


def test_wrong_kernel_is_caught_and_not_timed(tmp_path):
    cfg = typed(*SMALL, "experiment.kernels=[torch_bf16,bad]",
                "+experiment.registry.bad={_target_: tests.runners.wrong_kernels.scaled_bf16}")
    rec = MemoryRecorder()
    with pytest.raises(GemmFailed, match=r"bad on small at M=1: max_rel_err 0\.0\d+ > rtol 0.02"):
        run(cfg, tmp_path, rec)
    # 5 % off, seen through bf16 rounding of both outputs
    assert all(0.03 < e < 0.07 for e in rec.latest("small/bad/max_rel_err").values())
    assert "small/bad/latency_us" not in {k for k, _, _ in rec.metrics}
    assert set(rec.latest("small/torch_bf16/latency_us")) == {1, 8}  # the rest still measured


def test_model_shapes_and_moe_regime():
    cfg = typed("experiment=gemm")
    ms, regime = m_sweep(cfg)
    # Kimi: 128 concurrent tokens × top-8 / 384 experts = 2.67 tokens per expert → M = 3
    assert [r[0] for r in regime] == [1, 8, 32, 128] and regime[-1][1:] == [pytest.approx(8 / 3), 3, 384]
    assert ms == [1, 2, 3, 4, 8, 16, 32, 64]
    assert typed("experiment=gemm", "debug=quick").experiment.limit_points == 3
    assert m_sweep(typed("experiment=gemm", "debug=quick"))[0] == [1, 2, 3]


@pytest.mark.parametrize("override,msg", [
    ("experiment.kernels=[torch_bf16,nope]", "unknown kernel 'nope'"),
    ("experiment.shapes=[expert_up]", "unknown shape 'expert_up'"),
    ("experiment.m_values=[0,4]", "experiment.m_values=[0, 4]"),
    ("experiment.shards=[tp,half]", "shards contains 'half'"),
    ("experiment.tp=3", "cannot shard model kimi_k25_int4"),
])
def test_bad_gemm_configs(override, msg):
    with pytest.raises(ConfigError, match=msg.replace("[", r"\[").replace("]", r"\]")):
        typed("experiment=gemm", override)


def test_gemm_sweep_over_kernels_gives_children(k25):
    r = k25("-m", "experiment=gemm", "experiment.kernels=choice([torch_bf16],[torch_int4])",
            "experiment.m_values=[1,4]", "experiment.moe_concurrency=[1]", "experiment.calls=3",
            "experiment.moe_batches=[]",  # the MoE layer (vLLM's fused MoE): tests/gemm/test_moe.py
            "experiment.shapes=[expert_down]")
    assert r.returncode == 0, r.stderr[-3000:]
    runs = r.runs()
    children = [x for x in runs if x.data.tags.get("mlflow.parentRunId")]
    assert len(runs) == 3 and len(children) == 2
    keys = set().union(*(c.data.metrics for c in children))
    assert {"expert_down.tp2/torch_int4/latency_us", "expert_down.tp2/torch_int4/speedup_vs_bf16",
            "expert_down.tp2/torch_bf16/gbps"} <= keys
    hist = r.client.get_metric_history(children[1].info.run_id, "expert_down.tp2/torch_bf16/latency_us")
    assert sorted(m.step for m in hist) == [1, 4]


def test_bad_extra_shape():
    with pytest.raises(ConfigError, match=r"experiment.extra_shapes.x=.*expected \{n: N, k: K\}"):
        typed("experiment=gemm", "+experiment.extra_shapes.x={n: 0, k: 8}")


@pytest.mark.e2e
def test_unquantized_model_skips_w4a16_kernels_saying_why(tmp_path):
    cfg = typed("experiment=gemm", "model=tiny_kimi", "experiment.m_values=[1]",
                "experiment.moe_concurrency=[]", "experiment.moe_batches=[]",  # no fused layer
                "experiment.calls=2", "experiment.warmup=0", "experiment.shapes=[expert_down]")
    rec = MemoryRecorder()
    run(cfg, tmp_path, rec)
    assert "tiny_kimi has no int4 weights" in rec.tags["skipped.torch_int4"]
    assert set(rec.latest("expert_down.tp2/torch_bf16/latency_us")) == {1}


def test_p90_is_a_figure_from_ten_calls(tmp_path):
    rec = MemoryRecorder()
    run(typed(*SMALL, "experiment.kernels=[torch_bf16]", "experiment.calls=10",
              "experiment.m_values=[1]"), tmp_path, rec)
    (xs,) = gemm_samples(tmp_path / "samples.jsonl").values()
    x = sorted(xs)
    assert len(x) == 10
    # by hand, linear interpolation between order statistics: the p90's rank is 0.9 × 9 = 8.1,
    # the median's 4.5
    assert rec.latest("small/torch_bf16/latency_us_p90")[1] == pytest.approx(x[8] + 0.1 * (x[9] - x[8]))
    assert rec.latest("small/torch_bf16/latency_us")[1] == pytest.approx((x[4] + x[5]) / 2)


@pytest.mark.vllm  # vLLM's kernels in the job
def test_vllms_avx2_build_runs_the_fused_moe_and_linear_when_capped(k25):
    """hardware.vllm_cpu_isa=avx2 in a GEMM job (its own process: a process holds the first
    kernel build it loads for life): vLLM's fused MoE and its linear dispatch run from the
    AVX2 build, as on an AVX2-only CPU, and pass the correctness gate (fp32 reference)."""
    pytest.importorskip("vllm")
    from k25exp import vllm_kernels

    if vllm_kernels.native_level() is None:
        pytest.skip("needs an x86 CPU with AVX2")
    r = k25("experiment=gemm", "model=tiny_kimi", "hardware.vllm_cpu_isa=avx2",
            "experiment.shapes=[expert_down]", "experiment.m_values=[1,4]",
            "experiment.moe_concurrency=[]", "experiment.kernels=[torch_bf16,vllm_linear]",
            "experiment.moe_kernels=[vllm_fused_moe]", "experiment.moe_batches=[1,4]",
            "experiment.calls=2", "experiment.warmup=1")
    assert r.returncode == 0, r.stderr[-3000:]
    (run,) = r.runs()
    tags, m = run.data.tags, run.data.metrics
    assert tags["vllm.cpu_isa"] == "avx2" and run.data.params["hardware.vllm_cpu_isa"] == "avx2"
    assert not any(k.startswith("skipped.") for k in tags), tags
    for fig in ("moe.tp2/vllm_fused_moe/max_rel_err", "expert_down.tp2/vllm_linear/max_rel_err"):
        assert 0 <= m[fig] <= 2e-2, fig
    # what the dispatching candidate ran, per run of M
    assert tags["path.expert_down.tp2.vllm_linear"] == "vLLM's CPU dispatch at M 1–4"
