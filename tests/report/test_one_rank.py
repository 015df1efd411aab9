"""A campaign of one rank (the server at world size 1, as one TP-8 rank of Kimi runs on one
H200): the collectives and the wait are 0 ms, not missing; the budget closes and TPOT is
predicted at every macro level. GEMMs and MoE layers are budgeted with their in-stream time
where the GEMM run has one. Every expected figure is worked out by hand here."""

from __future__ import annotations

import re

import pytest

from k25exp.report import budget, expert_parallel, link, predict, reconcile
from k25exp.report import metrics as M
from k25exp.report.sources import Campaign
from tests.report.test_reconcile import DENSE_GEMMS, run

ONE = {"hardware.tp": "1", "hardware.world_size": "1", "server.tp": "1", "hardware.name": "h200_x1"}
LEVELS = (1, 8, 32, 128, 256)
# per call, µs at M = c: the dense GEMMs timed alone (a fixed cost each) and in one graph
ISOLATED = {1: 10.0, 8: 10.0, 32: 11.0, 128: 14.0, 256: 20.0}
INSTREAM = {1: 2.0, 8: 2.0, 32: 3.0, 128: 6.0, 256: 8.0}
MOE_ISOLATED = {1: 50.0, 8: 70.0, 32: 110.0, 128: 210.0, 256: 310.0}
MOE_INSTREAM = {1: 40.0, 8: 60.0, 32: 100.0, 128: 200.0, 256: 300.0}
SHARES = {"share_gemm_dense": 10.0, "share_moe": 20.0, "share_attention": 30.0,
          "share_norm_activation": 5.0, "share_memory": 1.0, "share_other": 2.0, "share_idle": 20.0}


def gemm_run(instream=True, t=10):
    steps = {}
    for n in DENSE_GEMMS:
        steps[f"{n}.tp1/torch_bf16/latency_us"] = dict(ISOLATED)
        if instream:
            steps[f"{n}.tp1/torch_bf16/latency_us_instream"] = dict(INSTREAM)
    steps["moe.tp1/vllm_fused_moe/latency_us"] = dict(MOE_ISOLATED)
    if instream:
        steps["moe.tp1/vllm_fused_moe/latency_us_instream"] = dict(MOE_INSTREAM)
    return run("gemm", t, {**ONE, "experiment.tp": "1", "experiment.baseline": "torch_bf16",
                           "experiment.graph": "True"},
               metrics={k: h[max(h)] for k, h in steps.items()}, steps=steps)


def one_rank_campaign(instream=True):
    """No nccl_burst (nothing to burst on one rank); profiles at c = 1 and 32 without any
    communication or wait metric (the trace has no collective to split)."""
    macro = run("macro", 11, ONE, {"single_stream_tpot_ms": 6.0, "single_stream_valid": 1.0},
                steps={"server_tpot_ms_mean": {1: 6.0, 8: 6.5, 32: 9.0, 128: 18.0, 256: 33.0},
                       "tpot_ms_p50": {1: 6.1, 8: 6.6, 32: 9.2, 128: 18.1, 256: 33.2},
                       # no prefill shared by any step (test_reconcile prices that part)
                       "prefill_tokens_per_decode_step": {k: 0.0 for k in (1, 8, 32, 128, 256)}})
    profiles = [run("profile", 12 + i, {**ONE, "experiment.concurrency": str(k)},
                    {"decode_step_ms": step, "between_steps_ms": gap, **SHARES})
                for i, (k, step, gap) in enumerate([(1, 5.0, 0.3), (32, 8.0, 0.5)])]
    return Campaign("rank", "uri", [gemm_run(instream), macro] + profiles)


def uncovered(c):
    """attention + norm + memory + other + idle = 58 % of the profiled step, + the wait
    (0 ms: no peer) + the host gap; linear between c = 1 and 32, held at 32 above it."""
    at1, at32 = 0.58 * 5.0 + 0.0 + 0.3, 0.58 * 8.0 + 0.0 + 0.5
    if c >= 32:
        return at32
    return at1 + (c - 1) / 31 * (at32 - at1)


def test_the_one_rank_budget_has_no_collectives_and_closes():
    sec = budget.decode_budget(one_rank_campaign())
    v = {f.key: f for f in sec.figures}
    assert v["comm_ms"].value == 0.0
    assert v["comm_ms"].note == "world size 1: no collectives, no peer to wait for: 0 ms"
    # GEMMs at M = 1 in-stream: 21 dense × 2 µs + 2 MoE layers × 40 µs = 122 µs
    assert v["gemm_ms"].value == pytest.approx((21 * 2.0 + 2 * 40.0) / 1e3)
    assert v["rest_ms"].value == pytest.approx(6.0 - 0.0 - 0.122)
    assert v["gemm_share"].value == pytest.approx(100 * 0.122 / 6.0)
    for key in ("comm_share_burst", "comm_share_profile_transport", "comm_share_profile_wait",
                "comm_share_profile", "comm_share_diff_pp"):
        assert v[key].value == 0.0, key
    assert any(n.startswith("world size 1: no collectives, no peer to wait for: 0 ms") for n in sec.notes)
    assert not [f for f in sec.figures if f.value is None]


def test_the_one_rank_reconciliation_counts_the_collectives_and_the_wait_as_zero():
    sec, per_c = reconcile.reconcile(one_rank_campaign())
    for k in (1, 32):
        m = per_c[k]
        assert m["comm_burst_ms"] == 0.0 and m["comm_wait_ms"] == 0.0 and m["comm_transport_ms"] == 0.0
        assert m["comm_allreduce_micro_ms"] == 0.0 and m["comm_allgather_micro_ms"] == 0.0
    # in-stream: c = 32, 21 × 3 µs; MoE 2 layers × 100 µs
    assert per_c[32]["gemm_micro_ms"] == pytest.approx(21 * 3.0 / 1e3)
    assert per_c[32]["moe_micro_ms"] == pytest.approx(2 * 100.0 / 1e3)
    rows = {r[0]: r for r in sec.tables[1].rows}
    assert rows["comm_allreduce"][4] == "world size 1: no collectives, no peer to wait for: 0 ms"
    assert rows["gemm"][4] == "timed in-stream" and rows["moe"][4] == "timed in-stream"
    assert any("world size 1" in n for n in sec.notes)


def test_one_rank_tpot_is_predicted_at_every_macro_level():
    c = one_rank_campaign()
    _, per_c = reconcile.reconcile(c)
    sec, out = predict.predict(c, per_c)
    assert sorted(out) == list(LEVELS)
    tpot = {1: 6.0, 8: 6.5, 32: 9.0, 128: 18.0, 256: 33.0}
    for k in LEVELS:
        want = 0.0 + 21 * INSTREAM[k] / 1e3 + 2 * MOE_INSTREAM[k] / 1e3 + uncovered(k)
        assert out[k]["tpot_pred_ms"] == pytest.approx(want), k
        assert out[k]["tpot_pred_err_pct"] == pytest.approx((want - tpot[k]) / tpot[k] * 100)
    rows = {r[0]: r for r in sec.tables[0].rows}
    assert all(rows[k][5] == 0.0 for k in LEVELS)  # the collectives column
    # above the highest profile the uncovered parts are held there, and each level says so
    assert "held at c=32" in rows[128][-1] and "held at c=32" in rows[256][-1]
    assert "held" not in rows[8][-1] and "missing" not in " ".join(r[-1] for r in rows.values())
    assert any(n.startswith("world size 1: no collectives, no peer to wait for: 0 ms") for n in sec.notes)


def test_without_an_instream_figure_the_isolated_one_is_used_and_said():
    c = one_rank_campaign(instream=False)
    _, per_c = reconcile.reconcile(c)
    sec, out = predict.predict(c, per_c)
    want = 21 * ISOLATED[8] / 1e3 + 2 * MOE_ISOLATED[8] / 1e3 + uncovered(8)
    assert out[8]["tpot_pred_ms"] == pytest.approx(want)
    note = {r[0]: r for r in sec.tables[0].rows}[8][-1]
    assert "no in-stream figure, timed gemm: isolated; moe: isolated" in note
    total, table, _, _ = budget.gemm_step(c.of("gemm"))
    assert total == pytest.approx((21 * 10.0 + 2 * 50.0) / 1e3)
    assert {r[6] for r in table.rows} == {"isolated"}


def test_the_gemm_table_shows_both_timings_and_which_was_used():
    g = gemm_run()
    # lm_head has no in-stream figure: its isolated one is used, the rest in-stream
    del g.steps["lm_head.tp1/torch_bf16/latency_us_instream"]
    del g.metrics["lm_head.tp1/torch_bf16/latency_us_instream"]
    total, table, missing, _ = budget.gemm_step([g])
    assert table.columns[4:7] == ["µs isolated", "µs in-stream", "used"]
    rows = {r[0]: r for r in table.rows}
    assert rows["o_proj"][4:8] == [10.0, 2.0, "in-stream", 3 * 2.0]  # 3 layers × 2 µs
    assert rows["lm_head"][4:8] == [10.0, None, "isolated", 10.0]
    moe = rows["routed experts (one fused MoE call, top-4)"]
    assert moe[3:8] == ["vllm_fused_moe", 50.0, 40.0, "in-stream", 2 * 40.0]
    assert not missing
    assert total == pytest.approx((20 * 2.0 + 10.0 + 2 * 40.0) / 1e3)
    assert "latency_us_instream" in table.note
    # the reconciliation at M = 8 counts the same mix, and says so
    micro = reconcile.Micro(Campaign("rank", "uri", [g]))
    assert micro.at("gemm", 8) == pytest.approx((20 * 2.0 + 10.0) / 1e3)
    # 10 shapes (lm_head among them) in the step besides the routed experts
    assert micro.timing[("gemm", 8)] == "9 GEMM shapes in-stream, 1 isolated (no in-stream figure at this M)"
    assert micro.at("moe", 8) == pytest.approx(2 * 60.0 / 1e3)


def test_an_int4_kernel_is_picked_by_the_figure_the_budget_uses():
    """Marlin is slower than torch's int4 alone (its launch) but faster in-stream: the
    server's graph runs it back to back, so the in-stream figure decides."""
    from k25exp.report.measured import auto_kernel

    key = "expert_down.tp1/{}/{}"
    steps = {key.format("marlin", "latency_us"): {1: 9.0}, key.format("marlin", "latency_us_instream"): {1: 1.5},
             key.format("torch_int4", "latency_us"): {1: 8.0},
             key.format("torch_int4", "latency_us_instream"): {1: 3.0}}
    g = run("gemm", 1, {"model.quant.method": "w4a16"}, metrics={k: v[1] for k, v in steps.items()},
            steps=steps)
    assert auto_kernel(g, "expert_down.tp1") == "marlin"


def test_only_what_needs_two_or_more_gpus_is_missing_from_a_one_rank_campaign():
    c = one_rank_campaign()
    for sec in (link.collectives(c), expert_parallel.expert_parallel(c)):
        for f in sec.figures:
            assert f.value is None and f.missing.startswith("missing: needs two or more GPUs"), f.label
            assert "world size 1" in f.missing
    # a campaign served on two ranks without the sweeps: missing for the usual reason
    two = Campaign("two", "uri", [run("macro", 1, {"server.tp": "2"})])
    assert "needs two or more GPUs" not in link.collectives(two).figures[0].missing


@pytest.mark.parametrize("rank_of", [None, "8"])
def test_the_report_of_a_one_rank_campaign_misses_only_multi_gpu_figures(tmp_path, monkeypatch,
                                                                          rank_of):
    """Through the report's runner: every one-GPU phase ran (macro, profile, gemm,
    spec_decode); every figure left missing needs two or more GPUs, and says so. With
    model.tp_rank_of (one TP-8 rank) the TP-8 section too: its measured burst and its
    wait/transport split."""
    import k25exp.runners.campaign_report as runner
    from k25exp.config.validate import to_typed
    from k25exp.tracking import MemoryRecorder
    from tests.conftest import compose_cfg

    c = one_rank_campaign()
    if rank_of:
        for r in c.runs:
            r.params.update({"model.tp_rank_of": rank_of, "model.num_key_value_heads": "8"})
    # a synthetic-acceptance sweep: α 0.5 and 0.9 at c = 1 and 4 (each point then projected
    # from the other α's step at its own level)
    pts = {f"{a}/{f}": v for a, tau in (("a0.5", 1.875), ("a0.9", 3.439)) for f, v in (
        ("spec_tpot_ms_med", 10.0 / tau), ("base_tpot_ms_med", 6.0), ("tokens_per_step_med", tau),
        ("speedup_med", 6.0 * tau / 10.0), ("rounds", 3.0))}
    c.runs += [run("spec_decode", 30, {**ONE, "experiment.method": "ngram",
                                       "experiment.num_speculative_tokens": "3",
                                       "experiment.acceptance": "synthetic"},
                   {"single_stream_tpot_ms": 4.0, "baseline/single_stream_tpot_ms": 6.0,
                    "spec_speedup": 1.5, "single_stream_acceptance_rate": 0.5,
                    "single_stream_tokens_per_chunk": 2.0, **pts},
                   steps={k: {1: v, 4: v} for k, v in pts.items()})]
    c.runs[1].steps["tpot_ms_p50"].update({2: 6.2, 4: 6.3})  # the projection's k + 1 levels
    monkeypatch.setattr(runner, "load_campaign", lambda uri, campaign_id: c)
    cfg = to_typed(compose_cfg("experiment=report", "experiment.campaign=rank", "tracking=none",
                               "experiment.tracking_uri=sqlite:///unused.db",
                               f"paths.outputs={tmp_path}"), gpu_count=lambda: 0)
    summary = runner.run(cfg, tmp_path / "job", MemoryRecorder())
    md = (tmp_path / "job" / "report.md").read_text()
    # figure rows (figure | value | runs | note) whose value is missing
    missing_rows = [line for line in md.splitlines()
                    if re.match(r"\| [^|]+ \| missing \|", line) and line.count(" | ") == 3]
    assert missing_rows, "the multi-GPU figures are listed as missing"
    for line in missing_rows:
        assert "needs two or more GPUs" in line, line
    assert summary[M.FIGURES_MISSING] == len({line for line in missing_rows})
    assert summary["comm_ms"] == 0.0 and summary[M.TPOT_PRED_ERR_MAX] is not None
    assert ("nccl_burst, allreduce_sweep, all_to_all need two or more GPUs" in md
            or "all_to_all, allreduce_sweep, nccl_burst need two or more GPUs" in md)
    assert "| nccl_burst | missing (needs two or more GPUs) |" in md
    if rank_of:
        assert "## TP 8 predicted from one TP-8 rank on one device" in md
        assert any(M.SCALEOUT_SPLIT.label in line for line in missing_rows)
        assert any(M.SCALEOUT_BURST.label in line for line in missing_rows)
