"""The report run's metric names: declared once in k25exp.report.metrics, unchanged by a label,
never shared by two figures. A synthetic campaign of every phase goes through the runner."""

from __future__ import annotations

import dataclasses

import pytest

import k25exp.runners.campaign_report as runner
from k25exp.config.validate import to_typed
from k25exp.report import metrics as M
from k25exp.report.figures import Figure
from k25exp.report.sources import Campaign
from k25exp.tracking import MemoryRecorder
from tests.conftest import compose_cfg
from tests.report.test_reconcile import campaign, run

# What the report logs for the campaign below; README, DESIGN.md and dashboards use these names.
LOGGED = {
    "tpot_ms", "comm_ms", "gemm_ms", "rest_ms", "comm_share_burst", "comm_share_profile",
    "comm_share_profile_transport", "comm_share_profile_wait", "comm_share_diff_pp", "gemm_share",
    "comm_share_server_burst", "comm_diff_placement_pp", "comm_diff_pattern_pp",
    "tpot_pred_err_pct_worst", "allreduce_busbw_pct_of_link", "ep_break_even_concurrency",
    "a2a_knee_tokens_per_gpu", "spec_measured_speedup.ngram_k_3",
    "spec_measured_speedup.draft_model_k_3_self_draft", "phases_missing", "figures_missing",
    "runs_refused", "tpot_pred_err_pct_max",
    # per macro level
    "tpot_pred_ms", "tpot_pred_err_pct", "tpot_pred_err_same_server_pct",
    # per profiled concurrency
    *(f"recon.{cat}_profile_ms" for cat in ("comm_allreduce", "comm_allgather", "gemm", "moe",
                                            "attention", "norm_activation", "memory", "other", "idle")),
    *(f"recon.{cat}_micro_ms" for cat in ("comm_allreduce", "comm_allgather", "gemm", "moe")),
    "recon.between_steps_ms", "recon.comm_burst_ms", "recon.comm_transport_ms", "recon.comm_wait_ms",
    "recon.comm_server_burst_ms",
    "recon.profiled_step_ms", "recon.tpot_ms", "recon.profiler_slowdown",
    "recon.prefill_us_per_token",  # the profile's prefill time per prompt token
    "recon.profile_server_tpot_ms", "recon.server_start_pct",  # the profile's own server start
}


def every_phase() -> Campaign:
    """test_reconcile's campaign, completed so that every report figure has a value."""
    c = campaign()
    for r in c.runs:
        if r.phase == "macro":
            r.metrics.update(single_stream_tpot_ms=10.0, single_stream_valid=1.0)
            r.steps["tpot_ms_p50"] = {1: 10.0, 2: 12.0, 4: 16.0, 8: 20.0}
        if r.phase == "gemm":
            for n in ("expert_gate_up", "expert_down"):
                r.steps[f"{n}.tp2/torch_bf16/latency_us"] = {1: 5.0, 8: 9.0}
            r.metrics.update({k: h[max(h)] for k, h in r.steps.items()})
        if r.phase == "profile":
            r.metrics["share_communication"] = 22.0
            r.metrics["server_burst_transport_ms"] = 1.5
            r.metrics.update(unprofiled_tpot_ms_mean=11.0, unprofiled_tpot_n=4.0)
    a2a = run("all_to_all", 20, {"hardware.world_size": "2", "hardware.backend": "gloo"},
              {"knee_tokens_per_gpu": 4.0}, steps={"a2a_us": {1: 10.0, 2: 10.0, 4: 100.0}})
    ar = run("allreduce_sweep", 21, {"hardware.world_size": "2", "hardware.link_gbps": "10.0",
                                     "hardware.interconnect": "shm"},
             steps={"time_us": {1024: 30.0, 2048: 30.0, 4096: 30.0, 8192: 30.0},
                    "busbw_gbps": {1024: 0.034, 8192: 0.273}})
    spec = [run("spec_decode", 22 + i, {"experiment.method": method,
                                        "experiment.num_speculative_tokens": "3", **draft},
                {"single_stream_tpot_ms": 8.0, "baseline/single_stream_tpot_ms": 10.0,
                 "spec_speedup": 1.25, "single_stream_acceptance_rate": 0.5,
                 "single_stream_tokens_per_chunk": 2.0})
            for i, (method, draft) in enumerate([("ngram", {}),
                                                 ("draft_model", {"experiment.draft_model": "self"})])]
    return Campaign(c.id, c.uri, c.runs + [a2a, ar] + spec)


def logged_keys(tmp_path, monkeypatch) -> set[str]:
    c = every_phase()
    monkeypatch.setattr(runner, "load_campaign", lambda uri, campaign_id: c)
    cfg = to_typed(compose_cfg("experiment=report", "experiment.campaign=c1", "tracking=none",
                               "experiment.tracking_uri=sqlite:///unused.db",
                               f"paths.outputs={tmp_path}"), gpu_count=lambda: 0)
    rec = MemoryRecorder()
    runner.run(cfg, tmp_path / "job", rec)
    return {k for k, _, _ in rec.metrics}, (tmp_path / "job" / "report.md").read_text()


def test_the_report_logs_the_documented_metric_names(tmp_path, monkeypatch):
    keys, md = logged_keys(tmp_path, monkeypatch)
    assert keys == LOGGED
    assert "| TPOT at batch 1 (macro) | 10.000 ms |" in md


def test_relabelling_every_figure_renames_no_metric(tmp_path, monkeypatch):
    for name in dir(M):
        if isinstance(getattr(M, name), M.Metric):
            old = getattr(M, name)
            monkeypatch.setattr(M, name, dataclasses.replace(old, label="relabelled " + old.label))
    for name in ("spec_measured",):  # the per-setting figures' labels too
        make = getattr(M, name)
        monkeypatch.setattr(M, name, lambda s, make=make: dataclasses.replace(
            make(s), label="relabelled " + make(s).label))
    keys, md = logged_keys(tmp_path / "relabelled", monkeypatch)
    assert keys == LOGGED
    assert "| relabelled TPOT at batch 1 (macro) |" in md
    assert "| relabelled measured speedup, ngram k=3 |" in md


def test_declared_figures_have_distinct_keys():
    keys = [m.key for m in M.FIGURES if m.key is not None]
    assert len(keys) == len(set(keys))
    assert all(m in M.FIGURES for m in vars(M).values() if isinstance(m, M.Metric))
    assert M.spec_measured("ngram k=3").key != M.spec_measured("ngram k=5").key


def test_two_figures_on_one_key_and_an_undeclared_figure_are_errors():
    twin = dataclasses.replace(M.COMM, label="another label")
    with pytest.raises(ValueError, match="two report figures log the metric 'comm_ms'"):
        runner.figure_metrics([Figure(M.COMM, 1.0), Figure(twin, 2.0)])
    assert runner.figure_metrics([Figure(M.COMM, 1.0), Figure(twin, None)]) == {"comm_ms": 1.0}
    with pytest.raises(ValueError, match="no metric key"):
        Figure(M.A2A_SWEEP, 1.0)
