"""Provenance, the reconciliation in ms and the TPOT prediction, on hand-built runs whose every
figure is written out here and the expected results computed by hand."""

from __future__ import annotations

import pytest

from k25exp.report import predict, provenance, reconcile
from k25exp.report.sources import Campaign
from k25exp.tracking.read import RunView

TINY = {"model.name": "tiny_kimi", "model.hidden_size": "512", "model.num_hidden_layers": "3",
        "model.first_k_dense_replace": "1", "model.n_routed_experts": "16",
        "model.num_experts_per_tok": "4", "model.n_shared_experts": "1",
        "model.moe_intermediate_size": "128", "model.intermediate_size": "1024",
        "model.num_attention_heads": "8", "model.q_lora_rank": "256", "model.kv_lora_rank": "512",
        "model.qk_nope_head_dim": "64", "model.qk_rope_head_dim": "64", "model.v_head_dim": "64",
        "model.vocab_size": "4096", "model.dtype": "bfloat16", "model.dtype_bytes": "2",
        "model.quant.method": "none", "hardware.name": "cpu_local", "hardware.tp": "2"}
# tiny_kimi's GEMMs per step besides the routed experts (vLLM's DeepseekV2 at TP 2): router,
# shared gate_up + down in 2 MoE layers (6), dense gate_up + down in 1 layer (2), MLA's
# fused_qkv_a, q_b, kv_b, o_proj in 3 layers (12), lm_head (1)
DENSE_GEMMS = {"router": 2, "shared_gate_up": 2, "shared_down": 2, "dense_gate_up": 1,
               "dense_down": 1, "fused_qkv_a_proj": 3, "q_b_proj": 3, "kv_b_proj": 3,
               "o_proj": 3, "lm_head": 1}


def run(phase, t, params=None, metrics=None, steps=None, tags=None):
    return RunView(f"{phase}{t:04d}".ljust(32, "0"), "1", phase, "FINISHED", t,
                   params={**TINY, **(params or {})}, metrics=metrics or {}, steps=steps or {},
                   tags={"git_commit": "abc", **(tags or {})})


def campaign():
    bursts = [run("nccl_burst", t, {"experiment.tokens": str(tok), "experiment.ops_per_step": "null",
                                    "experiment.communicator": "vllm"},
                  {"burst_ms": b, "allreduce_ms_per_step": ar, "allgather_ms_per_step": ag})
              for t, (tok, b, ar, ag) in enumerate([(1, 1.0, 0.8, 0.1), (8, 2.0, 1.6, 0.2)])]
    gemm_steps = {f"{n}.tp2/torch_bf16/latency_us": {1: 10.0, 8: 20.0} for n in DENSE_GEMMS}
    gemm_steps["moe.tp2/vllm_fused_moe/latency_us"] = {1: 50.0, 8: 100.0}
    gemm = run("gemm", 10, {"experiment.tp": "2", "experiment.baseline": "torch_bf16",
                            "experiment.graph": "False"}, steps=gemm_steps)
    # the engine's TPOT (server mean) is the reference; the client's p50 carries stalls
    macro = run("macro", 11, steps={"server_tpot_ms_mean": {1: 10.0, 2: 11.0, 4: 12.0, 8: 16.0},
                                    "tpot_ms_p50": {1: 30.0, 2: 3.0, 4: 12.5, 8: 16.5},
                                    # prompt tokens prefilled inside a decode step, per step
                                    "prefill_tokens_per_decode_step": {1: 0.0, 2: 4.0, 4: 12.0,
                                                                       8: 28.0}})
    profiles = [run("profile", 12 + i, {"experiment.concurrency": str(k)},
                    {"decode_step_ms": step, "share_comm_allreduce": 20.0, "share_comm_allgather": 2.0,
                     "share_gemm_dense": 10.0, "share_moe": 10.0, "share_attention": 30.0,
                     "share_norm_activation": 5.0, "share_memory": 1.0, "share_other": 2.0,
                     "share_idle": 20.0, "comm_transport_ms_per_step": 0.5,
                     "comm_wait_ms_per_step": 1.7, "comm_raw_ms_per_step": 2.2,
                     "between_steps_ms": 0.4, "prefill_us_per_token": pf})
                for i, (k, step, pf) in enumerate([(1, 12.0, 20.0), (4, 16.0, 10.0)])]
    return Campaign("c1", "uri", bursts + [gemm, macro] + profiles)


def test_a_run_of_another_model_is_refused_by_name():
    c = campaign()
    stray = run("nccl_burst", 99, {"model.name": "kimi_k25_int4", "experiment.tokens": "1"})
    kept, refused = provenance.check(Campaign(c.id, c.uri, c.runs + [stray]))
    assert [str(r) for r in refused] == [
        f"run {stray.short} (nccl_burst) refused: model.name=kimi_k25_int4, the campaign's is tiny_kimi"]
    assert stray not in kept.runs and len(kept.runs) == len(c.runs)
    other_code = run("gemm", 98, {"experiment.tp": "2"}, tags={"git_commit": "def"})
    _, refused = provenance.check(Campaign(c.id, c.uri, c.runs + [other_code]))
    # commits this repository does not have: compared by the commit alone
    assert refused[0].field == "code_sha256" and refused[0].value == "commit def"
    torch_burst = run("nccl_burst", 97, {"experiment.communicator": "torch", "experiment.tokens": "1"})
    _, refused = provenance.check(Campaign(c.id, c.uri, c.runs + [torch_burst]))
    assert refused[0].field == "experiment.communicator" and refused[0].expected == "vllm"
    assert provenance.random_weights(c)


def test_a_gpu_profile_timed_by_its_host_ranges_is_refused():
    """A GPU trace whose steps came from host annotations (Kineto wrote no device copy and
    none was rebuilt) read a 21 ms device step as its 4.7 ms host range on the H100: its
    shares are not the device's. The same tag on a CPU trace is the CPU's only timeline."""
    c = campaign()
    gpu = run("profile", 99, {"experiment.concurrency": "1", "hardware.device": "cuda"},
              tags={"trace.step_source": "user_annotation", "device_found": "NVIDIA H100 80GB HBM3"})
    _, refused = provenance.check(Campaign(c.id, c.uri, c.runs + [gpu]))
    assert [(r.run.short, r.field, r.value) for r in refused] == [
        (gpu.short, "trace.step_source", "user_annotation")]
    cpu = run("profile", 98, {"experiment.concurrency": "1", "hardware.device": "cpu"},
              tags={"trace.step_source": "user_annotation", "device_found": "AMD EPYC"})
    rebuilt = run("profile", 97, {"experiment.concurrency": "1", "hardware.device": "cuda"},
                  tags={"trace.step_source": "gpu_user_annotation", "device_found": "NVIDIA H100"})
    _, refused = provenance.check(Campaign(c.id, c.uri, c.runs + [cpu]))
    assert refused == []
    assert provenance.host_steps_on_a_device(rebuilt) is None


def test_a_whole_model_run_is_refused_in_a_campaign_of_one_tp_rank():
    """model.tp_rank_of=8 (one rank's layers, served at TP 1) and the whole model answer
    different questions even with the same model.name."""
    c = campaign()
    c = Campaign(c.id, c.uri, [RunView(r.run_id, r.experiment_id, r.phase, r.status, r.start_time,
                                       params={**r.params, "model.tp_rank_of": "8"}, metrics=r.metrics,
                                       steps=r.steps, tags=r.tags) for r in c.runs])
    whole = run("profile", 99, {"experiment.concurrency": "1", "model.tp_rank_of": "None"})
    assert refused_fields(c, whole) == {whole.short: ("model.tp_rank_of", "None", "8")}


def refused_fields(c, stray):
    """{run short id: the field it was refused on} with `stray` added to campaign c."""
    kept, refused = provenance.check(Campaign(c.id, c.uri, c.runs + [stray]))
    assert all(r.run is not stray for r in refused) or stray not in kept.runs
    return {r.run.short: (r.field, r.value, r.expected) for r in refused}


def test_each_phase_is_checked_at_the_tp_it_ran():
    c = campaign()
    for r in c.runs:  # the served phases ran server.tp = hardware.tp = 2
        if r.phase in ("macro", "profile"):
            r.params["server.tp"] = "2"
    # a server at TP 1 under hardware.tp=2 (the test suite's server fixture does this)
    tp1 = run("macro", 90, {"server.tp": "1"})
    assert refused_fields(c, tp1) == {tp1.short: ("tp (as run)", "1", "2")}
    # a GEMM run that sharded for TP 1 under hardware.tp=2
    gemm1 = run("gemm", 91, {"experiment.tp": "1", "experiment.graph": "False"})
    assert refused_fields(c, gemm1) == {gemm1.short: ("tp (as run)", "1", "2")}
    # collectives run at hardware.tp; their server.* params (composed, never run) are not read
    burst = run("nccl_burst", 92, {"experiment.tokens": "4", "experiment.ops_per_step": "null",
                                   "experiment.communicator": "vllm", "server.tp": "1"})
    assert refused_fields(c, burst) == {}


VLLM = "vllm version (server.version, else tag vllm.version)"


@pytest.mark.parametrize("tags, field, value", [
    ({"vllm": "0.31.0"}, VLLM, "0.31.0"),
    ({"vllm.version": "0.31.0"}, VLLM, "0.31.0"),
    ({"server.version": "0.31.0", "vllm": "0.32.0"}, VLLM,
     "0.31.0"),
    ({"vllm.cpu_isa": "avx2"}, "vllm.cpu_isa (kernel build)", "avx2"),
    ({"device_found": "NVIDIA H100 80GB HBM3"}, "device (device_found)", "NVIDIA H100 80GB HBM3"),
])
def test_runs_of_another_vllm_cpu_build_or_device_are_refused(tags, field, value):
    c = campaign()
    for r in c.runs:
        r.tags.update({"vllm": "0.32.0", "vllm.cpu_isa": "avx512", "device_found": "NVIDIA H200"})
    for r in c.runs:
        if r.phase == "macro":
            r.tags["server.version"] = "0.32.0"
    stray = run("gemm", 95, {"experiment.tp": "2", "experiment.graph": "False"},
                tags={"vllm": "0.32.0", "vllm.cpu_isa": "avx512", "device_found": "NVIDIA H200",
                      **tags})
    assert refused_fields(c, stray) == {stray.short: (field, value, {
        "0.31.0": "0.32.0", "avx2": "avx512", "NVIDIA H100 80GB HBM3": "NVIDIA H200"}[value])}
    kept, refused = provenance.check(Campaign(c.id, c.uri, c.runs + [stray]))
    assert f"refused: {field}={value}" in str(refused[0])


def test_a_served_run_of_another_attention_backend_is_refused():
    """A profile of an AMX CPU's server (AMX_MLA) beside a campaign served on CPU_MLA times
    other attention kernels: refused by name. A server that could not say (an endpoint) and a
    phase without a server are not checked for it; the header line names the backend."""
    c = campaign()
    for r in c.runs:
        if r.phase in ("macro", "profile"):
            r.tags["vllm.attention_backend"] = "CPU_MLA"
    amx = run("profile", 93, {"experiment.concurrency": "1"}, tags={"vllm.attention_backend": "AMX_MLA"})
    assert refused_fields(c, amx) == {amx.short: ("vllm.attention_backend", "AMX_MLA", "CPU_MLA")}
    endpoint = run("macro", 94, tags={"vllm.attention_backend": "unknown (server=endpoint: no server log here)"})
    gemm = run("gemm", 95, {"experiment.tp": "2", "experiment.graph": "False"},
               tags={"vllm.attention_backend": "AMX_MLA"})  # not served: never read
    assert refused_fields(c, endpoint) == {} and refused_fields(c, gemm) == {}
    assert "vllm.attention_backend CPU_MLA" in provenance.ran_with(c)
    assert "model.name tiny_kimi" in provenance.ran_with(c)


def test_a_run_that_loaded_no_cpu_kernels_is_not_refused_for_it():
    c = campaign()
    for r in c.runs:
        r.tags["vllm.cpu_isa"] = "avx512"
    # a GEMM job that timed only torch kernels, or a server whose process was gone: no build
    for value in ("none loaded", "unknown (server process gone)", "n/a (not vLLM's CPU build)"):
        stray = run("gemm", 96, {"experiment.tp": "2", "experiment.graph": "False"},
                    tags={"vllm.cpu_isa": value})
        assert refused_fields(c, stray) == {}
    # nor for a vLLM version when it had none installed (it ran none of vLLM's code)
    for r in c.runs:
        r.tags["vllm.version"] = "0.32.0"
    stray = run("gemm", 97, {"experiment.tp": "2", "experiment.graph": "False"},
                tags={"vllm.version": "not installed"})
    assert refused_fields(c, stray) == {}


def test_reconciliation_figures_equal_the_runs_they_cite():
    sec, per_c = reconcile.reconcile(campaign())
    one, four = per_c[1], per_c[4]
    # profile ms = share % × step: 20 % of 12 ms
    assert one["comm_allreduce_profile_ms"] == pytest.approx(2.4)
    assert four["attention_profile_ms"] == pytest.approx(0.3 * 16.0)
    assert one["gemm_profile_ms"] == pytest.approx(1.2)  # gemm_dense + gemm_quantized (absent)
    # micro at c = 1: the burst run's figures as logged
    assert one["comm_allreduce_micro_ms"] == 0.8 and one["comm_burst_ms"] == 1.0
    # at c = 4, log-log between tokens 1 and 8: y1 · (y8/y1)^(log 4 / log 8) = y1 · 2^(2/3)
    assert four["comm_allreduce_micro_ms"] == pytest.approx(0.8 * 2 ** (2 / 3))
    # 21 GEMMs per step at 10 µs (M = 1); MoE: 2 MoE layers × 50 µs
    assert one["gemm_micro_ms"] == pytest.approx(21 * 10.0 / 1e3)
    assert one["moe_micro_ms"] == pytest.approx(2 * 50.0 / 1e3)
    assert four["gemm_micro_ms"] == pytest.approx(21 * 10.0 * 2 ** (2 / 3) / 1e3)
    assert one["comm_transport_ms"] == 0.5 and one["comm_wait_ms"] == 1.7
    # the profiled step period (step + the host gap between steps, 0.4 ms) over the engine's
    # TPOT, which holds both: 12.4 ms profiled per 10 ms unprofiled at c = 1
    assert one["profiler_slowdown"] == pytest.approx((12.0 + 0.4) / 10.0)
    assert four["profiler_slowdown"] == pytest.approx((16.0 + 0.4) / 12.0)
    assert len(sec.tables) == 2 and sec.tables[0].title.startswith("concurrency 1")
    assert "(profiled step + between-steps gap) / TPOT" in sec.tables[0].note


def test_no_profiler_slowdown_without_the_gap_between_steps():
    c = campaign()
    for r in c.runs:
        if r.phase == "profile":
            del r.metrics["between_steps_ms"]
    sec, per_c = reconcile.reconcile(c)
    # the step alone would read 12 / 10 = 1.2: not the slowdown, which needs the step's period
    assert all("profiler_slowdown" not in m for m in per_c.values())
    assert "no between_steps_ms" in sec.tables[0].note


def test_tpot_is_predicted_at_every_macro_level():
    c = campaign()
    _, per_c = reconcile.reconcile(c)
    sec, out = predict.predict(c, per_c)
    # uncovered = attention 30 + norm 5 + memory 1 + other 2 + idle 20 = 58 % of the step,
    # + the collectives' wait for the last rank (1.7 ms) + host time between steps (0.4 ms)
    unc1, unc4 = 0.58 * 12.0 + 1.7 + 0.4, 0.58 * 16.0 + 1.7 + 0.4
    pred1 = 1.0 + 21 * 10.0 / 1e3 + 2 * 50.0 / 1e3 + unc1
    assert out[1]["tpot_pred_ms"] == pytest.approx(pred1)
    assert out[1]["tpot_pred_err_pct"] == pytest.approx((pred1 - 10.0) / 10.0 * 100)
    # + the prefills a step shares: at c = 2, 4 tokens × (20 µs + (10 − 20) / 3, linear in c
    # between the profiles at 1 and 4); at 4, 12 × 10 µs; at 8, 28 × 10 µs (held at c = 4)
    f = 2 ** (1 / 3)  # c = 2 between tokens 1 and 8 (log-log); uncovered linear between c 1 and 4
    pred2 = (1.0 * f + 21 * 10.0 * f / 1e3 + 2 * 50.0 * f / 1e3 + unc1 + (unc4 - unc1) / 3
             + 4 * (20.0 - 10.0 / 3) / 1e3)
    assert out[2]["tpot_pred_ms"] == pytest.approx(pred2)
    # c = 8: the micro points end at 8; the uncovered parts are held at c = 4, and said so
    pred8 = 2.0 + 21 * 20.0 / 1e3 + 2 * 100.0 / 1e3 + unc4 + 28 * 10.0 / 1e3
    assert out[8]["tpot_pred_ms"] == pytest.approx(pred8)
    rows = {r[0]: r for r in sec.tables[0].rows}
    assert "held at c=4" in rows[8][-1]
    assert rows[1][10] == 0.0 and rows[8][10] == pytest.approx(0.28)  # the prefills column, ms
    assert rows[1][6] == rows[1][5] == 1.0  # collectives: the nccl_burst figure, also beside
    # c = 4: micro log-log between tokens 1 and 8 (× 4^(1/3) … = 2^(2/3)); uncovered at c = 4
    g = 2 ** (2 / 3)
    pred4 = 1.0 * g + 21 * 10.0 * g / 1e3 + 2 * 50.0 * g / 1e3 + unc4 + 12 * 10.0 / 1e3
    assert out[4]["tpot_pred_ms"] == pytest.approx(pred4)
    # the worst level by |error|, over the engine's TPOT 10, 11, 12, 16 ms at c = 1, 2, 4, 8
    errs = {1: (pred1 - 10.0) / 10.0 * 100, 2: (pred2 - 11.0) / 11.0 * 100,
            4: (pred4 - 12.0) / 12.0 * 100, 8: (pred8 - 16.0) / 16.0 * 100}
    worst = max(errs.values(), key=abs)
    assert sec.figures[0].value == pytest.approx(worst) and sec.figures[0].key == "tpot_pred_err_pct_worst"


def test_every_category_of_the_profiles_rules_is_a_part_of_the_prediction():
    """A profile analysed with rules that have categories beyond the usual ones (convolution,
    other collectives, an all-to-all, a user's own 'sampler': its tag trace.categories) has
    each as a reconciliation row and a part of the prediction: its time is not dropped.
    Same step as campaign()'s, attention 30 % split into 24 + convolution 3 + comm_other 2 +
    sampler 1 (+ all-to-all 0): the uncovered parts stay 58 % of the step, by hand."""
    c = campaign()
    cats = ("attention,moe,gemm_quantized,gemm_dense,convolution,norm_activation,other,memory,"
            "comm_allreduce,comm_all_to_all,comm_allgather,comm_other,sampler")
    for r in c.runs:
        if r.phase == "profile":
            r.tags["trace.categories"] = cats
            r.metrics.update({"share_attention": 24.0, "share_convolution": 3.0,
                              "share_comm_other": 2.0, "share_sampler": 1.0,
                              "share_comm_all_to_all": 0.0})
    sec, per_c = reconcile.reconcile(c)
    rows = {r[0]: r for r in sec.tables[0].rows}  # c = 1, a 12 ms step
    for cat, share in (("convolution", 3.0), ("comm_other", 2.0), ("sampler", 1.0),
                       ("comm_all_to_all", 0.0), ("attention", 24.0), ("idle", 20.0)):
        assert rows[cat][2] == pytest.approx(share / 100 * 12.0), cat
    assert "gemm_dense" not in rows and "gemm_quantized" not in rows  # in the gemm row
    _, out = predict.predict(c, per_c)
    unc1 = 0.58 * 12.0 + 1.7 + 0.4  # 24 + 3 + 5 + 1 + 2 + 2 + 1 + 0 + 20 = 58 % of 12 ms
    assert out[1]["tpot_pred_ms"] == pytest.approx(1.0 + 21 * 10.0 / 1e3 + 2 * 50.0 / 1e3 + unc1)


def test_profiles_of_another_request_shape_than_the_macros_are_said_in_both_sections():
    """The prediction takes the profile's step for the macro's: a profile of shorter requests
    (less context per step) than the macro's is named, with both shapes, in the
    reconciliation and the prediction; matching shapes, or a shape not logged, say nothing."""
    def notes(c):
        sec_r, per_c = reconcile.reconcile(c)
        sec_p, _ = predict.predict(c, per_c)
        return " ".join(sec_r.notes), " ".join(sec_p.notes)

    c = campaign()
    assert notes(c) == ("", "")  # no shape logged
    for r in c.runs:
        if r.phase == "macro":
            r.params.update({"experiment.input_tokens": "128", "experiment.output_tokens": "64"})
        if r.phase == "profile":
            r.params.update({"experiment.input_tokens": "128", "experiment.output_tokens": "64"})
    assert notes(c) == ("", "")  # the same shape
    for r in c.runs:
        if r.phase == "profile" and r.param("experiment.concurrency", int) == 4:
            r.params.update({"experiment.input_tokens": "32", "experiment.output_tokens": "32"})
    for text in notes(c):
        assert "(128 prompt / 64 output tokens)" in text and "c = 4: 32 / 32" in text
        assert "c = 1:" not in text  # c = 1 ran the macro's shape


def test_the_profiles_server_start_is_set_against_the_macros():
    """A profile that timed its level without the profiler on its own server start (12 ms at
    c = 1, 4 requests) against the macro's server (10 ms): +20 % that no part explains, said
    in the table's caption and logged; a profile without that figure says nothing of it."""
    c = campaign()
    for r in c.runs:
        if r.phase == "profile" and r.param("experiment.concurrency", int) == 1:
            r.metrics.update({"unprofiled_tpot_ms_mean": 12.0, "unprofiled_tpot_n": 4.0})
    sec, per_c = reconcile.reconcile(c)
    assert per_c[1]["profile_server_tpot_ms"] == 12.0
    assert per_c[1]["server_start_pct"] == pytest.approx((12.0 / 10.0 - 1) * 100)
    assert "12.000 ms TPOT (mean of 4 requests), +20.0 % against the macro's server" in sec.tables[0].note
    assert "server_start_pct" not in per_c[4] and "without the profiler" not in sec.tables[1].note
    # the prediction at c = 1 (hand-computed as in test_tpot_is_predicted_at_every_macro_level)
    # against that server start too; c = 4's profile has no such figure
    psec, out = predict.predict(c, per_c)
    pred1 = 1.0 + 21 * 10.0 / 1e3 + 2 * 50.0 / 1e3 + 0.58 * 12.0 + 1.7 + 0.4
    assert out[1]["tpot_pred_err_same_server_pct"] == pytest.approx((pred1 - 12.0) / 12.0 * 100)
    rows = {r[0]: r for r in psec.tables[0].rows}
    assert rows[1][12] == pytest.approx((pred1 - 12.0) / 12.0 * 100) and rows[4][12] is None
    assert "tpot_pred_err_same_server_pct" not in out[4]


@pytest.mark.parametrize("part, metric", [("wait", "comm_wait_ms_per_step"),
                                          ("between_steps", "between_steps_ms"),
                                          ("attention", "share_attention")])
def test_a_level_missing_an_uncovered_part_gets_no_prediction(part, metric):
    c = campaign()
    for r in c.runs:
        if r.phase == "profile" and r.param("experiment.concurrency", int) == 4:
            del r.metrics[metric]  # the part is missing at c = 4 only
    _, per_c = reconcile.reconcile(c)
    sec, out = predict.predict(c, per_c)
    rows = {r[0]: r for r in sec.tables[0].rows}
    # c = 1 has every part; at c = 2 (between 1 and 4), 4 and 8 (held at 4) the part is
    # taken from c = 4, where it is missing: nothing predicted, and the note names it
    assert sorted(out) == [1]
    for level in (2, 4, 8):
        assert rows[level][4] is None and rows[level][11] is None  # predicted, error %
        assert f"missing: {part}" in rows[level][-1]
    unc1 = 0.58 * 12.0 + 1.7 + 0.4
    assert out[1]["tpot_pred_ms"] == pytest.approx(1.0 + 21 * 10.0 / 1e3 + 2 * 50.0 / 1e3 + unc1)


def test_prefills_shared_need_the_macros_count_and_a_profiles_cost():
    """Without the macro's count (a run older than the figure) no level but none is
    predicted; without any profile's prefill cost, only c = 1 (no other request) is."""
    c = campaign()
    macro = next(r for r in c.runs if r.phase == "macro")
    del macro.steps["prefill_tokens_per_decode_step"]
    _, per_c = reconcile.reconcile(c)
    sec, out = predict.predict(c, per_c)
    assert out == {} and all("prefill_tokens_per_decode_step" in r[-1] for r in sec.tables[0].rows)
    c = campaign()
    for r in c.runs:
        if r.phase == "profile":
            del r.metrics["prefill_us_per_token"]
    _, per_c = reconcile.reconcile(c)
    sec, out = predict.predict(c, per_c)
    assert sorted(out) == [1]
    assert "no profile of this campaign timed a prefill step" in {r[0]: r for r in sec.tables[0].rows}[4][-1]


def test_the_macros_own_marginal_prefill_cost_prices_the_prefills_shared():
    """A macro run with its own fit (level_figures: prefill_shared_us_per_token over
    prefill_fit_n requests, decode_only_tpot_ms) prices the prefills a step shares with it,
    not the profiles' prefill steps: at c = 2, 4 tokens × 30 µs; at 4 the fit is negative
    (−5 µs, noise), so 0; at 8, 28 × 12 µs. The decode-only TPOT has its column."""
    c = campaign()
    macro = next(r for r in c.runs if r.phase == "macro")
    macro.steps.update({"prefill_shared_us_per_token": {2: 30.0, 4: -5.0, 8: 12.0},
                        "prefill_fit_n": {2: 8.0, 4: 16.0, 8: 32.0},
                        "decode_only_tpot_ms": {1: 10.0, 2: 10.9, 4: 12.1, 8: 15.7}})
    _, per_c = reconcile.reconcile(c)
    sec, out = predict.predict(c, per_c)
    rows = {r[0]: r for r in sec.tables[0].rows}
    assert [rows[k][10] for k in (1, 2, 4, 8)] == pytest.approx([0.0, 0.12, 0.0, 0.336])
    assert [rows[k][3] for k in (1, 2, 4, 8)] == [10.0, 10.9, 12.1, 15.7]
    assert "× 30.00 µs (measured: the macro level's own requests, least squares over n = 8; " \
           "the profiles' prefill steps: 16.67 µs)" in rows[2][-1]
    assert "× 0 µs (fit -5.00 µs: no cost above the noise; measured: " in rows[4][-1]
    # the prediction at c = 8 (as in test_tpot_is_predicted_at_every_macro_level) with 28 × 12 µs
    pred8 = 2.0 + 21 * 20.0 / 1e3 + 2 * 100.0 / 1e3 + 0.58 * 16.0 + 1.7 + 0.4 + 28 * 12.0 / 1e3
    assert out[8]["tpot_pred_ms"] == pytest.approx(pred8)
    # without a profile's prefill cost, the macro's fit alone still prices every level
    for r in c.runs:
        if r.phase == "profile":
            del r.metrics["prefill_us_per_token"]
    _, per_c = reconcile.reconcile(c)
    _, out = predict.predict(c, per_c)
    assert sorted(out) == [1, 2, 4, 8]


@pytest.mark.parametrize("ref, taken", [(11.4, 1.0),    # overhead 12 + 0.4 − 11.4 = 1 ms
                                        (9.0, 2.4),     # 3.4 ms, but idle holds 20 % × 12
                                        (12.9, None)])  # − 0.5 ms: nothing to take out
def test_the_profilers_overhead_measured_on_its_server_is_taken_out_of_idle(ref, taken):
    """The c = 1 profile's level without the profiler has a decode-only TPOT `ref`: the
    profiler's overhead per step is its step (12 ms) + gap (0.4) − ref, taken out of that
    profile's idle (2.4 ms), never below 0; c = 4's profile has none, so its idle stays."""
    c = campaign()
    for r in c.runs:
        if r.phase == "profile" and r.param("experiment.concurrency", int) == 1:
            r.metrics["unprofiled_decode_only_tpot_ms"] = ref
    sec_r, per_c = reconcile.reconcile(c)
    assert per_c[1]["profiler_overhead_ms"] == pytest.approx(12.4 - ref)
    assert "profiler_overhead_ms" not in per_c[4]
    sec, out = predict.predict(c, per_c)
    unc1 = 0.58 * 12.0 + 1.7 + 0.4 - (taken or 0.0)
    assert out[1]["tpot_pred_ms"] == pytest.approx(1.0 + 21 * 10.0 / 1e3 + 2 * 50.0 / 1e3 + unc1)
    pred8 = 2.0 + 21 * 20.0 / 1e3 + 2 * 100.0 / 1e3 + 0.58 * 16.0 + 1.7 + 0.4 + 28 * 10.0 / 1e3
    assert out[8]["tpot_pred_ms"] == pytest.approx(pred8)  # held at c = 4: untouched
    note = sec.tables[0].note
    if taken:
        assert "idle less the profiler's own overhead per step" in note and f"c=1 {taken:.3f}" in note
    else:
        assert "the uncovered parts carry the profiler's own overhead" in note


def test_a_burst_split_at_each_ops_last_arrival_is_budgeted_with_its_transport():
    """vLLM's CPU ops return when done: the burst's transport (its wait left out, the
    profile's wait is a part of its own) is the collectives' figure, interpolated as the
    whole burst was (log-log in tokens): 0.6 ms at 1 token, 1.2 at 8."""
    c = campaign()
    for r in c.runs:
        if r.phase == "nccl_burst":
            r.metrics["burst_transport_ms"] = r.metrics["burst_ms"] * 0.6
            r.metrics["burst_wait_ms"] = r.metrics["burst_ms"] * 0.3
    _, per_c = reconcile.reconcile(c)
    _, out = predict.predict(c, per_c)
    unc1 = 0.58 * 12.0 + 1.7 + 0.4
    assert out[1]["tpot_pred_ms"] == pytest.approx(0.6 + 21 * 10.0 / 1e3 + 2 * 50.0 / 1e3 + unc1)
    assert per_c[1]["comm_burst_ms"] == pytest.approx(0.6)


def test_the_burst_timed_in_the_servers_workers_is_the_predictions_collectives():
    """On a CPU communicator (the burst split, its transport budgeted) with the profiles'
    in-server burst: that is the collectives' part, linear in c between the profiles and held
    outside them; the nccl_burst figure stands beside it; the reconciliation shows its row."""
    c = campaign()
    for r in c.runs:
        if r.phase == "nccl_burst":
            r.metrics["burst_transport_ms"] = r.metrics["burst_ms"] * 0.6
        if r.phase == "profile":  # transport 0.5 ms per step in both profiles
            r.metrics["server_burst_transport_ms"] = {1: 0.8, 4: 1.4}[r.param("experiment.concurrency", int)]
    sec_r, per_c = reconcile.reconcile(c)
    sec, out = predict.predict(c, per_c)
    unc1 = 0.58 * 12.0 + 1.7 + 0.4
    assert out[1]["tpot_pred_ms"] == pytest.approx(0.8 + 21 * 10.0 / 1e3 + 2 * 50.0 / 1e3 + unc1)
    rows = {r[0]: r for r in sec.tables[0].rows}
    assert rows[1][5] == pytest.approx(0.8) and rows[4][5] == pytest.approx(1.4)
    assert rows[2][5] == pytest.approx(0.8 + (1.4 - 0.8) / 3)  # linear in c between 1 and 4
    assert rows[8][5] == pytest.approx(1.4) and "collectives: in-server burst held at c=4" in rows[8][-1]
    assert rows[1][6] == pytest.approx(0.6) and rows[8][6] == pytest.approx(1.2)  # nccl_burst beside
    recon1 = {r[0]: r for r in sec_r.tables[0].rows}["communication (in-server burst)"]
    assert recon1[1:4] == pytest.approx([0.8, 0.5, 0.3])
    assert "2 profiled level(s)" in sec.tables[0].note
    # a communicator the budget takes whole (no split: e.g. NCCL): the nccl_burst figure
    c = campaign()
    for r in c.runs:
        if r.phase == "profile":
            r.metrics["server_burst_transport_ms"] = 0.8
    _, per_c = reconcile.reconcile(c)
    sec, out = predict.predict(c, per_c)
    assert out[1]["tpot_pred_ms"] == pytest.approx(1.0 + 21 * 10.0 / 1e3 + 2 * 50.0 / 1e3 + unc1)


def test_a_server_running_cuda_graphs_is_budgeted_with_the_graph_replay():
    c = campaign()
    for r in c.runs:
        if r.phase == "nccl_burst":
            r.metrics["graph_burst_ms"] = r.metrics["burst_ms"] / 10
    assert reconcile.Micro(c).at("comm", 1) == 1.0  # the CPU server runs eager
    for r in c.runs:
        if r.phase in ("macro", "profile"):
            r.params["server.enforce_eager"] = "False"
    assert reconcile.Micro(c).at("comm", 1) == pytest.approx(0.1)
