"""The report's arithmetic on hand-built runs: formulas, interpolation, missing sources."""

from __future__ import annotations

import pytest

from k25exp.report import budget, expert_parallel, speculative
from k25exp.report import metrics as M
from k25exp.report.measured import interp_loglog
from k25exp.report.speculative import effective_alpha, expected_tokens
from k25exp.report.sources import Campaign
from k25exp.tracking.read import RunView

MODEL = {"model.hidden_size": "512", "model.num_hidden_layers": "3", "model.first_k_dense_replace": "1",
         "model.dtype_bytes": "2"}


def run(phase, metrics=None, params=None, steps=None, status="FINISHED", t=0, tags=None):
    return RunView(f"{phase}{t:04d}" + "0" * 24, "1", phase, status, t, params={**MODEL, **(params or {})},
                   metrics=metrics or {}, tags=tags or {}, steps=steps or {})


def test_expected_tokens_is_the_geometric_sum():
    assert expected_tokens(0.0, 5) == 1.0
    assert expected_tokens(1.0, 3) == 4.0
    assert expected_tokens(0.5, 3) == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    with pytest.raises(ValueError, match="alpha"):
        expected_tokens(1.5, 3)


@pytest.mark.parametrize("alpha,k", [(0.1, 1), (0.6, 3), (0.95, 7)])
def test_effective_alpha_inverts_expected_tokens(alpha, k):
    assert effective_alpha(expected_tokens(alpha, k) - 1, k) == pytest.approx(alpha, abs=1e-9)


def test_effective_alpha_clamps_at_the_ends():
    assert effective_alpha(0.0, 3) == 0.0 and effective_alpha(3.0, 3) == 1.0


def test_interpolation_is_log_log_and_never_extrapolates():
    pts = {1: 10.0, 4: 40.0, 16: 40.0}
    assert interp_loglog(pts, 4) == 40.0
    assert interp_loglog(pts, 2) == pytest.approx(20.0)  # a power law between 1 and 4
    assert interp_loglog(pts, 8) == pytest.approx(40.0)
    assert interp_loglog(pts, 0.5) is None and interp_loglog(pts, 32) is None


def test_ep_break_even_is_where_the_sign_flips():
    # 2 ranks, 2 MoE layers, 1024 B per token. EP = 2 × 2 × a2a; TP = 2 × AR(c × 1024 B).
    a2a = run("all_to_all", params={"hardware.world_size": "2", "hardware.backend": "gloo"},
              steps={"a2a_us": {1: 10.0, 2: 10.0, 4: 100.0}})
    ar = run("allreduce_sweep", steps={"time_us": {1024: 30.0, 2048: 30.0, 4096: 30.0, 8192: 30.0}})
    sec = expert_parallel.expert_parallel(Campaign("c", "uri", [a2a, ar]))
    rows = {r[0]: r for r in sec.tables[0].rows}
    assert sorted(rows) == [1, 2, 4, 8]  # tokens/GPU = ceil(c/2) up to the a2a sweep's 4
    assert rows[1][3] == pytest.approx(2 * 2 * 10.0 / 1e3) and rows[1][6] == pytest.approx(2 * 30.0 / 1e3)
    assert [rows[c][8] for c in (1, 2, 4, 8)] == ["yes", "yes", "yes", "no"]
    f = sec.get("EP break-even concurrency")
    assert f.value == 8 and "stops paying" in f.note


def test_missing_phases_are_named_never_filled():
    failed = run("macro", status="FAILED", tags={"error": "vLLM exited with code 1"})
    burst = run("nccl_burst", {"burst_ms": 2.0}, {"experiment.tokens": "1", "experiment.ops_per_step": "6"})
    sec = budget.decode_budget(Campaign("c", "uri", [failed, burst]))
    tpot = sec.get("TPOT at batch 1 (macro)")
    assert tpot.value is None and "macro" in tpot.missing and "FAILED" in tpot.missing
    assert "vLLM exited with code 1" in tpot.missing
    assert sec.get("communication per step (collectives burst)").value == 2.0
    assert sec.get("rest (attention, norms, routing, host)").value is None
    assert sec.get("communication share (burst / TPOT)").value is None
    assert "profile" in sec.get("communication share (profile)").missing


def test_a_lagged_single_stream_phase_is_called_out():
    burst = run("nccl_burst", {"burst_ms": 1.0}, params={"experiment.tokens": "1"})
    notes = lambda valid: budget.decode_budget(Campaign("c", "uri", [run(
        "macro", {"single_stream_tpot_ms": 10.0, "single_stream_valid": valid}), burst])).notes
    assert not any("single-stream phase is flagged invalid" in n for n in notes(1.0))
    assert any("single-stream phase is flagged invalid" in n for n in notes(0.0))


def test_batch_1_speculation_as_measured():
    spec = run("spec_decode", {"single_stream_tpot_ms": 8.0, "baseline/single_stream_tpot_ms": 10.0,
                               "spec_speedup": 1.25, "single_stream_acceptance_rate": 0.5,
                               "single_stream_tokens_per_chunk": 2.0},
               {"experiment.method": "ngram", "experiment.num_speculative_tokens": "3"})
    sec = speculative.speculative(Campaign("c", "uri", [spec]))
    (row,) = sec.tables[0].rows
    # 2 tokens per streamed step, drafted or not → the α whose E(α, 3) is 2
    assert expected_tokens(row[3], 3) == pytest.approx(2.0)
    assert row[4:8] == [10.0, 8.0, 1.25, pytest.approx(8.0 * 2.0)]  # measured step = TPOT × tokens
    assert sec.get("measured speedup, ngram k=3").value == 1.25
    # no projection from the macro's TPOT at c = k + 1 any more (the step model replaced it)
    assert not [f for f in sec.figures if "projected" in f.label]
    assert speculative.speculative(Campaign("c", "uri", [])).figures[0].value is None


def test_int4_models_use_w4a16_only_where_the_checkpoint_is_int4():
    model = {"model.hidden_size": "512", "model.num_hidden_layers": "2", "model.first_k_dense_replace": "0",
             "model.n_routed_experts": "4", "model.num_experts_per_tok": "2", "model.n_shared_experts": "0",
             "model.moe_intermediate_size": "64", "model.intermediate_size": "128",
             "model.num_attention_heads": "2", "model.q_lora_rank": "0", "model.kv_lora_rank": "64",
             "model.qk_nope_head_dim": "16", "model.qk_rope_head_dim": "16", "model.v_head_dim": "16",
             "model.vocab_size": "256", "model.quant.method": "w4a16"}
    # this model's GEMMs per step, written out: 2 MoE layers (no dense, no shared expert),
    # routed experts top_k = 2 each, no q LoRA (q_proj, not q_b_proj), lm_head once
    per_step = {"expert_gate_up": 2 * 2, "expert_down": 2 * 2, "router": 2, "q_proj": 2,
                "kv_a_proj_with_mqa": 2, "kv_b_proj": 2, "o_proj": 2, "lm_head": 1}
    steps, metrics = {}, {}
    for n in per_step:  # marlin is faster than bf16 on every shape
        for kern, us in (("torch_bf16", 10.0), ("marlin", 4.0)):
            key = f"{n}.tp1/{kern}/latency_us"
            steps[key], metrics[key] = {1: us}, us
    gemm = RunView("g" * 32, "1", "gemm", "FINISHED", 0, params={**model, "experiment.tp": "1"},
                   metrics=metrics, steps=steps)
    total, table, missing, _ = budget.gemm_step([gemm])
    kernels = {row[0]: row[3] for row in table.rows}
    assert not missing and {n for n, k in kernels.items() if k == "marlin"} == {"expert_gate_up", "expert_down"}
    assert set(kernels.values()) == {"marlin", "torch_bf16"}
    assert {row[0]: row[2] for row in table.rows} == per_step
    # experts 8 × 4 µs (marlin) + the other 11 GEMMs × 10 µs (bf16)
    assert total == pytest.approx((8 * 4.0 + 11 * 10.0) / 1e3)


def test_spec_settings_that_differ_only_in_extra_are_kept_apart():
    common = {"experiment.method": "draft_model", "experiment.num_speculative_tokens": "3"}
    m = {"single_stream_tpot_ms": 20.0, "baseline/single_stream_tpot_ms": 10.0, "spec_speedup": 0.5,
         "single_stream_tokens_per_chunk": 2.0}
    runs = [run("spec_decode", m, {**common, "experiment.draft_model": "self",
                                   "experiment.extra.synthetic_acceptance_length": "2.5"}, t=1),
            run("spec_decode", m, {**common, "experiment.draft_model": "self",
                                   "experiment.extra.synthetic_acceptance_length": "1.5"}, t=2),
            run("spec_decode", m, {**common, "experiment.draft_model": "/models/small-draft"}, t=3)]
    sec = speculative.speculative(Campaign("c", "uri", runs))
    measured = [f.label for f in sec.figures if f.label.startswith("measured")]
    assert len(measured) == 3 and len(set(measured)) == 3
    assert "measured speedup, draft_model k=3 (self-draft) [synthetic_acceptance_length=2.5]" in measured
    assert "measured speedup, draft_model k=3 (draft small-draft)" in measured


def test_every_share_is_a_percentage_of_its_denominator():
    from tests.report.test_metric_keys import every_phase

    sec = budget.decode_budget(every_phase())
    v = {f.key: f.value for f in sec.figures}
    # batch-1 TPOT 10 ms; burst at tokens = 1: 1 ms; the c = 1 profile: transport 0.5 ms,
    # wait 1.7 ms per step, share_communication 22 (%, as the profile logs it)
    assert v["comm_share_burst"] == pytest.approx(10.0)
    assert v["comm_share_profile_transport"] == pytest.approx(5.0)
    assert v["comm_share_profile_wait"] == pytest.approx(17.0)
    assert v["comm_share_profile"] == pytest.approx(22.0)
    assert v["comm_share_diff_pp"] == pytest.approx(10.0 - 5.0)
    # GEMMs at M = 1: 21 dense GEMMs × 10 µs + the routed experts as the server runs them,
    # one fused MoE call per MoE layer at 1 token: 2 layers × 50 µs (not 2 shapes × top-4 ×
    # 2 layers × 5 µs of separate expert GEMMs) = 0.31 ms of the 10 ms TPOT
    assert v["gemm_ms"] == pytest.approx(0.31) and v["gemm_share"] == pytest.approx(3.1)
    rows = {row[0]: row for row in sec.tables[0].rows}
    # per step, kernel, µs isolated, µs in-stream (a CPU run has none), used, µs per step
    assert rows["routed experts (one fused MoE call, top-4)"][2:8] == [
        2, "vllm_fused_moe", 50.0, None, "isolated", 100.0]
    assert "expert_gate_up" not in rows and "expert_down" not in rows


def test_a_negative_residual_is_drawn_and_labelled_negative():
    from k25exp.report.charts import budget_bars

    bars = budget_bars({"communication (burst)": 6.0, "GEMM": 5.5, "rest": -1.5})
    # (name, left, width, label): the parts stack to 11.5 ms; the rest is the 1.5 ms by which
    # they overshoot the 10 ms TPOT, drawn back from their end, never as "rest 0.00 ms"
    assert bars[:2] == [("communication (burst)", 0.0, 6.0, "communication (burst) 6.00 ms"),
                        ("GEMM", 6.0, 5.5, "GEMM 5.50 ms")]
    name, left, width, label = bars[2]
    assert (name, left, width) == ("rest", 10.0, 1.5)
    assert label == "rest −1.50 ms (negative: the parts exceed TPOT)"


def test_a_profile_at_another_concurrency_is_named_never_passed_off_as_batch_1():
    from tests.report.test_metric_keys import every_phase

    c = every_phase()
    c.runs = [r for r in c.runs if not (r.phase == "profile" and r.param("experiment.concurrency") == "1")]
    sec = budget.decode_budget(c)
    by_key = {f.key: f for f in sec.figures}
    # the c = 4 profile's exposed share of its own step: shown, and named as c = 4
    prof = by_key["comm_share_profile"]
    assert prof.value == 22.0 and "concurrency 4 (no batch-1 profile)" in prof.label
    assert sec.tags == {"report.budget_profile_concurrency": "4 (no profile at concurrency 1)"}
    # its per-step transport and wait over the batch-1 TPOT would mix two batches: missing
    for key in ("comm_share_profile_transport", "comm_share_profile_wait", "comm_share_diff_pp"):
        assert by_key[key].value is None and "no profile at concurrency 1" in by_key[key].missing
    full = budget.decode_budget(every_phase())
    assert full.tags == {"report.budget_profile_concurrency": "1"}
    assert full.get(M.COMM_SHARE_PROFILE).label == M.COMM_SHARE_PROFILE.label


def test_the_reference_kernel_is_never_the_w4a16_kernel_the_server_runs():
    from k25exp.report.measured import auto_kernel

    params = {"model.quant.method": "w4a16", "experiment.baseline": "torch_bf16"}
    key = "expert_down.tp1/{}/latency_us"
    # the dequantize + matmul oracle is the fastest here; a server runs torch_int4 or Marlin
    both = RunView("g" * 32, "1", "gemm", "FINISHED", 0, params=params, steps={
        key.format("w4a16_reference"): {1: 3.0}, key.format("torch_int4"): {1: 4.0}},
        metrics={key.format("w4a16_reference"): 3.0, key.format("torch_int4"): 4.0})
    assert auto_kernel(both, "expert_down.tp1") == "torch_int4"
    only_ref = RunView("h" * 32, "1", "gemm", "FINISHED", 0, params=params,
                       steps={key.format("w4a16_reference"): {1: 3.0}},
                       metrics={key.format("w4a16_reference"): 3.0})
    assert auto_kernel(only_ref, "expert_down.tp1") is None
