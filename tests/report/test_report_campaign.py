"""./multirun.sh end to end on the embedded default (debug=quick), then the report's numbers
checked against the MLflow store it names; and a campaign with a failed and missing phases."""

from __future__ import annotations

import re
from pathlib import Path

import pytest


pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1800)]


def latest(runs, phase, **params):
    rs = [r for r in runs if r.data.tags.get("k25exp.experiment") == phase and r.info.status == "FINISHED"
          and all(r.data.params.get(k) == v for k, v in params.items())]
    return max(rs, key=lambda r: r.info.start_time)


SERVED = ("macro", "profile", "spec_decode")


def served_unlike_vllms_rule(runs) -> list[str]:
    """The served runs whose tags say other than an eager CPU server of an MLA model with the
    attention backend vLLM picks here (asked of vLLM: AMX_MLA where torch sees AMX tiles, else
    CPU_MLA); [] when none, and a served run must be there."""
    from tests.conftest import vllm_cpu_attention_backend

    want = {"vllm.attention_backend": vllm_cpu_attention_backend(), "vllm.enforce_eager": "true",
            "vllm.cudagraph_mode": "NONE"}
    served = [r for r in runs if r.data.tags.get("k25exp.experiment") in SERVED]
    if not served:
        return ["no served run"]
    return [f"{r.data.tags['k25exp.experiment']}: {k}={r.data.tags.get(k)}, expected {v}"
            for r in served for k, v in want.items() if r.data.tags.get(k) != v]


def test_the_served_runs_backend_is_vllms_choice_on_the_cpu_that_ran(monkeypatch):
    """Hand-built runs as a campaign on an AMX CPU tags them (AMX_MLA; CI on such a CPU failed
    when this was the literal CPU_MLA), with torch's AMX probe standing in for the CPU."""
    import torch
    from types import SimpleNamespace

    pytest.importorskip("vllm")

    def runs(backend):
        tags = {"vllm.attention_backend": backend, "vllm.enforce_eager": "true",
                "vllm.cudagraph_mode": "NONE"}
        return [SimpleNamespace(data=SimpleNamespace(tags={"k25exp.experiment": p, **tags}))
                for p in (*SERVED, "gemm")]

    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)
    assert served_unlike_vllms_rule(runs("AMX_MLA")) == []
    assert served_unlike_vllms_rule(runs("CPU_MLA")) == [
        f"{p}: vllm.attention_backend=CPU_MLA, expected AMX_MLA" for p in SERVED]
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    assert served_unlike_vllms_rule(runs("CPU_MLA")) == []
    assert len(served_unlike_vllms_rule(runs("AMX_MLA"))) == 3
    assert served_unlike_vllms_rule(runs("CPU_MLA")[3:]) == ["no served run"]


@pytest.fixture
def full(campaign_full):
    """The session's campaign (tests/conftest.py): (process, MLflow client, phase runs)."""
    return campaign_full.proc, campaign_full.client, campaign_full.runs


def test_every_phase_runs_and_the_script_says_where_the_report_is(full):
    p, _, runs = full
    assert re.search(r"8 phase\(s\) ok \(nccl_burst allreduce_sweep all_to_all gemm macro profile "
                     r"spec_decode report\), 0 failed; \d+ min \d+ s", p.stdout)
    html = Path(re.search(r"^    report: (\S+)$", p.stdout, re.M).group(1))
    md = Path(re.search(r"^    report \(markdown\): (\S+)$", p.stdout, re.M).group(1))
    assert html.parent.name == "c-full" and html.exists() and md.exists()
    page = html.read_text()
    # self-contained: every plot inlined, nothing fetched from elsewhere
    # budget, TPOT predicted vs measured, EP, speculative decoding
    assert page.count('src="data:image/png;base64,') == 4 and "src=\"http" not in page
    assert {r.data.tags.get("campaign") for r in runs} == {"c-full"}
    # the headline table is printed
    assert "TPOT at batch 1 (macro)" in p.stdout and "communication share (profile transport" in p.stdout
    assert "NOTE: the served checkpoint has random weights" in p.stdout
    # what the served runs say the server ran: the campaign's eager CPU server on an MLA model,
    # with the attention backend vLLM's rule gives on this CPU (under the suite's ISA cap)
    assert served_unlike_vllms_rule(runs) == []
    from tests.conftest import vllm_cpu_attention_backend  # ...and the report's header says it

    ran = f"vllm.attention_backend {vllm_cpu_attention_backend()}"
    assert ran in md.read_text().split("## Headline")[0] and ran in p.stdout
    # the campaign's servers ran at TP 2, each rank on its own block of cores (the server log's
    # header: k25exp's argv and added environment), and none outlived it (campaign_full)
    log = Path(latest(runs, "macro").data.tags["server.log"]).read_text()
    header = log.splitlines()[:2]
    assert "--tensor-parallel-size 2" in header[0] and "VLLM_CPU_OMP_THREADS_BIND=0|1" in header[1]
    assert sum(f"Worker_TP{r} pid=" in log for r in (0, 1)) == 2  # a worker process per rank
    # the GEMM run kept every timed call, which compare tests medians with
    gemm = latest(runs, "gemm")
    assert "samples.jsonl" in {a.path for a in full[1].list_artifacts(gemm.info.run_id)}


def test_report_figures_match_the_runs_they_name(full):
    _, client, runs = full
    report = latest(runs, "report")
    m, tags = report.data.metrics, report.data.tags
    sources = set(tags["report.source_runs"].split())
    macro, burst = latest(runs, "macro"), latest(runs, "nccl_burst", **{"experiment.tokens": "1"})
    gemm, profile = latest(runs, "gemm"), latest(runs, "profile", **{"experiment.concurrency": "1"})
    profile8 = latest(runs, "profile", **{"experiment.concurrency": "8"})
    assert {macro.info.run_id, burst.info.run_id, gemm.info.run_id, profile.info.run_id} <= sources
    assert m["tpot_ms"] == pytest.approx(macro.data.metrics["single_stream_tpot_ms"])
    # vLLM's CPU ops return when done: the burst is split at each op's last arrival and the
    # budget takes its transport (the profile's wait is a part of its own)
    bm = burst.data.metrics
    assert "burst_transport_ms" in bm and bm["burst_transport_ms"] <= bm["burst_ms"]
    assert m["comm_ms"] == pytest.approx(bm["burst_transport_ms"])
    # GEMM per step from the GEMM run's M=1 points × tiny_kimi's GEMMs per step at TP 2
    # (cpu_local), written out: 3 layers, the first dense; in each of the 2 MoE layers the
    # routed experts as one fused MoE call (vLLM's cpu_fused_moe at 1 token), 1 shared expert
    # and the router; MLA with a q LoRA in all 3 layers; lm_head once
    per_step = {"router": 2, "shared_gate_up": 2,
                "shared_down": 2, "dense_gate_up": 1, "dense_down": 1, "fused_qkv_a_proj": 3,
                "q_b_proj": 3, "kv_b_proj": 3, "o_proj": 3, "lm_head": 1}
    fused = client.get_metric_history(gemm.info.run_id, "moe.tp2/vllm_fused_moe/latency_us")
    want = {h.step: h.value for h in fused}[1] * 2
    for name, count in per_step.items():
        # vLLM's own linear dispatch where it was timed (the CPU build's path), else F.linear
        hist = client.get_metric_history(gemm.info.run_id, f"{name}.tp2/vllm_linear/latency_us") \
            or client.get_metric_history(gemm.info.run_id, f"{name}.tp2/torch_bf16/latency_us")
        want += {h.step: h.value for h in hist}[1] * count
    assert m["gemm_ms"] == pytest.approx(want / 1e3)
    assert m["rest_ms"] == pytest.approx(m["tpot_ms"] - m["comm_ms"] - m["gemm_ms"])
    # every share in percent, the profile's as the report's
    assert m["comm_share_burst"] == pytest.approx(100 * m["comm_ms"] / m["tpot_ms"])
    assert m["comm_share_profile"] == pytest.approx(profile.data.metrics["share_communication"])
    pm = profile.data.metrics
    assert m["comm_share_profile_transport"] == pytest.approx(100 * pm["comm_transport_ms_per_step"] / m["tpot_ms"])
    assert m["comm_share_profile_wait"] == pytest.approx(100 * pm["comm_wait_ms_per_step"] / m["tpot_ms"])
    assert m["comm_share_diff_pp"] == pytest.approx(
        m["comm_share_burst"] - m["comm_share_profile_transport"])
    assert m["runs_refused"] == 0

    def hist(run_id, key):
        return {h.step: h.value for h in client.get_metric_history(run_id, key)}

    # the reconciliation at each profiled concurrency cites its profile run
    for k, pr in ((1, profile), (8, profile8)):
        step = pr.data.metrics["decode_step_ms"]
        assert hist(report.info.run_id, "recon.profiled_step_ms")[k] == pytest.approx(step)
        assert hist(report.info.run_id, "recon.comm_transport_ms")[k] == pytest.approx(
            pr.data.metrics["comm_transport_ms_per_step"])
        assert hist(report.info.run_id, "recon.attention_profile_ms")[k] == pytest.approx(
            pr.data.metrics["share_attention"] / 100 * step)
        if k in hist(macro.info.run_id, "server_tpot_ms_mean"):  # debug=quick: levels 1, 2, 4
            assert hist(report.info.run_id, "recon.tpot_ms")[k] == pytest.approx(
                hist(macro.info.run_id, "server_tpot_ms_mean")[k])
    # TPOT predicted at every macro level; the error against the macro run's own TPOT
    pred, err = hist(report.info.run_id, "tpot_pred_ms"), hist(report.info.run_id, "tpot_pred_err_pct")
    tpot = hist(macro.info.run_id, "server_tpot_ms_mean")  # the engine's TPOT
    assert sorted(pred) == sorted(tpot) == [1, 2, 4]
    for k in pred:
        assert err[k] == pytest.approx((pred[k] - tpot[k]) / tpot[k] * 100)
    assert m["tpot_pred_err_pct_max"] == pytest.approx(max(abs(v) for v in err.values()))
    spec = [r for r in runs if r.data.tags.get("k25exp.experiment") == "spec_decode"]
    assert len(spec) == 2
    for r in spec:
        assert r.info.run_id in sources
    measured = {k: v for k, v in m.items() if k.startswith("spec_measured_speedup.")}
    assert sorted(measured.values()) == pytest.approx(sorted(r.data.metrics["spec_speedup"] for r in spec))
    assert not [k for k in m if k.startswith("spec_projected_speedup.")]  # the closed form is gone
    assert m["phases_missing"] == 0
    # EP: computed inside both sweeps (break-even, or a figure saying EP never/always pays)
    md = Path(tags["k25exp.output_dir"], "report.md").read_text()
    assert "| EP break-even concurrency |" in md
    # the EP row at concurrency 1, recomputed from the two sweeps' histories (1 token per GPU,
    # 1024 B AllReduce; tiny_kimi has 2 MoE layers)
    a2a, ar = latest(runs, "all_to_all"), latest(runs, "allreduce_sweep")
    a2a_us = {h.step: h.value for h in client.get_metric_history(a2a.info.run_id, "a2a_us")}[1]
    ar_us = {h.step: h.value for h in client.get_metric_history(ar.info.run_id, "time_us")}[1024]
    row = next(line for line in md.splitlines() if line.startswith("| 1 | 1 |")).split("|")
    assert float(row[4]) == pytest.approx(2 * 2 * a2a_us / 1e3, abs=6e-4)
    assert float(row[7]) == pytest.approx(2 * ar_us / 1e3, abs=6e-4)
    # the all-reduce's busbw at the sweep's largest size, in % of the link's GB/s per direction
    busbw = {h.step: h.value for h in client.get_metric_history(ar.info.run_id, "busbw_gbps")}
    link = float(ar.data.params["hardware.link_gbps"])
    assert m["allreduce_busbw_pct_of_link"] == pytest.approx(busbw[max(busbw)] / link * 100)
    for r in (macro, burst, gemm, profile):
        assert f"#/experiments/{r.info.experiment_id}/runs/{r.info.run_id}" in md
