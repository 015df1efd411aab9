"""TP N predicted from a campaign of one TP-N rank, on hand-built runs: every expected figure
is worked out by hand in the comments."""

from __future__ import annotations

import dataclasses

import pytest

from k25exp.config.experiments import ExternalBurst
from k25exp.report import metrics as M
from k25exp.report.scale_out import scale_out
from k25exp.report.sources import Campaign, ReportError
from tests.report.test_reconcile import run

KIMI_RANK = {"model.name": "kimi_k25_int4", "model.num_hidden_layers": "61", "model.tp_rank_of": "8",
             "server.tp": "1", "hardware.name": "h200_x1"}


def rank_campaign(levels=None):
    tpot = levels or {1: 6.83, 4: 7.0, 8: 7.41}
    return Campaign("rank", "uri", [run("macro", 1, KIMI_RANK, steps={"server_tpot_ms_mean": tpot})])


def test_the_seeds_external_burst_per_op_times_the_steps_ops():
    sec, per = scale_out(rank_campaign(), dataclasses.asdict(ExternalBurst()))
    # 6.81 ms / 122 ops = 55.82 µs per op; at TP 8 a step has 2 × 61 + 2 = 124 collectives:
    # 6.9218 ms at every batch; + the rank's TPOT
    comm = 6.81 / 122 * 124
    assert per[1][M.SCALEOUT_TPOT_PRED] == pytest.approx(6.83 + comm)
    assert per[8][M.SCALEOUT_TPOT_PRED] == pytest.approx(7.41 + comm)
    assert per[8][M.SCALEOUT_TOK_S_PRED] == pytest.approx(8 / (7.41 + comm) * 1e3)
    fig = sec.get(M.SCALEOUT_TPOT_C1)
    assert fig.value == pytest.approx(6.83 + comm)
    # quoted as someone else's, never as k25exp's, and every assumption listed
    assert fig.note.startswith("external, not measured by k25exp: the seed campaign's burst")
    assert "55.8 µs per op × 124 ops" in fig.note and "RTX PRO 6000" in fig.note
    assert sum(n.startswith("assumed:") for n in sec.notes) == 5
    assert any("12-13 ms at batch 1" in n for n in sec.notes)
    assert sec.title == "TP 8 predicted from one TP-8 rank on one device"


def test_a_burst_measured_on_the_n_gpu_box_is_used_when_given():
    bursts = Campaign("h200x8", "uri", [
        run("nccl_burst", t, {"experiment.tokens": str(tok), "experiment.ops_per_step": "null",
                              "hardware.name": "h200_x8_nvlink", "hardware.tp": "8"},
            {"burst_ms": ms}) for t, (tok, ms) in enumerate([(1, 1.0), (8, 2.0)])])
    sec, per = scale_out(rank_campaign(), dataclasses.asdict(ExternalBurst()), lambda: bursts)
    # tokens 1 → 1.0 ms, 8 → 2.0 ms; 4 tokens log-log between: 2^(log 4 / log 8) = 2^(2/3)
    assert per[1][M.SCALEOUT_TPOT_PRED] == pytest.approx(6.83 + 1.0)
    assert per[4][M.SCALEOUT_TPOT_PRED] == pytest.approx(7.0 + 2 ** (2 / 3))
    assert per[8][M.SCALEOUT_TPOT_PRED] == pytest.approx(7.41 + 2.0)
    assert sec.get(M.SCALEOUT_TPOT_C1).note.startswith("measured: the step's 124 collectives")
    assert "h200_x8_nvlink" in sec.tags["report.scaleout_collectives"]


def test_the_rank_served_with_graphs_takes_the_bursts_graph_replay():
    """Whether the burst stands in for a graph-replayed step is the rank's server's setting:
    the collectives campaign on the N-GPU box has no server of its own to ask."""
    bursts = Campaign("h200x8", "uri", [
        run("nccl_burst", 0, {"experiment.tokens": "1", "experiment.ops_per_step": "null"},
            {"burst_ms": 1.0, "graph_burst_ms": 0.25})])
    graphs = Campaign("rank", "uri", [run("macro", 1, {**KIMI_RANK, "server.enforce_eager": "False"},
                                          steps={"server_tpot_ms_mean": {1: 6.83}})])
    _, per = scale_out(graphs, dataclasses.asdict(ExternalBurst()), lambda: bursts)
    assert per[1][M.SCALEOUT_TPOT_PRED] == pytest.approx(6.83 + 0.25)
    eager = Campaign("rank", "uri", [run("macro", 1, {**KIMI_RANK, "server.enforce_eager": "True"},
                                         steps={"server_tpot_ms_mean": {1: 6.83}})])
    _, per = scale_out(eager, dataclasses.asdict(ExternalBurst()), lambda: bursts)
    assert per[1][M.SCALEOUT_TPOT_PRED] == pytest.approx(6.83 + 1.0)


def test_a_collectives_campaign_not_found_or_without_a_burst_falls_back_and_says_why():
    def not_there():
        raise ReportError("campaign 'h200x9' has no phase runs in uri")

    sec, per = scale_out(rank_campaign(), dataclasses.asdict(ExternalBurst()), not_there)
    assert per[1][M.SCALEOUT_TPOT_PRED] == pytest.approx(6.83 + 6.81 / 122 * 124)  # the seed's
    assert ("experiment.scale_out.collectives_campaign: campaign 'h200x9' has no phase runs in "
            "uri: the external figure is used") in sec.notes
    sweep_only = Campaign("h200x8", "uri", [run("nccl_burst", 0, {"experiment.ops_per_step": "1"},
                                                {"burst_ms": 1.0})])
    sec, _ = scale_out(rank_campaign(), dataclasses.asdict(ExternalBurst()), lambda: sweep_only)
    assert any(n.startswith("experiment.scale_out.collectives_campaign: campaign h200x8 has no run "
                            "of the step's collectives") for n in sec.notes)


def test_outside_the_measured_tokens_there_is_no_prediction():
    bursts = Campaign("h200x8", "uri", [
        run("nccl_burst", 0, {"experiment.tokens": "8", "experiment.ops_per_step": "null"},
            {"burst_ms": 2.0})])
    sec, per = scale_out(rank_campaign(), dataclasses.asdict(ExternalBurst()), lambda: bursts)
    assert sorted(per) == [8]  # c = 1 and 4 lie below the one measured token count
    fig = sec.get(M.SCALEOUT_TPOT_C1)
    assert fig.value is None and fig.missing == "no collectives figure at 1 token"


def test_a_whole_model_campaign_has_no_such_section():
    whole = Campaign("w", "uri", [run("macro", 1, {**KIMI_RANK, "model.tp_rank_of": "None"},
                                      steps={"server_tpot_ms_mean": {1: 12.0}})])
    assert scale_out(whole, dataclasses.asdict(ExternalBurst())) == (None, {})


def test_an_int4_checkpoints_moe_is_timed_by_marlin():
    """The reconciliation's MoE micro figure for a W4A16 model is vLLM's Marlin MoE (what the
    server runs for compressed-tensors INT4 experts), not the bf16 fused MoE."""
    from k25exp.report.reconcile import Micro

    params = {**KIMI_RANK, "experiment.tp": "1", "model.quant.method": "w4a16",
              "model.first_k_dense_replace": "1"}
    steps = {"moe.tp1/vllm_fused_moe/latency_us": {1: 168.0}, "moe.tp1/vllm_marlin_moe/latency_us": {1: 24.0}}
    g = run("gemm", 2, params, steps=steps)
    assert Micro(Campaign("k", "uri", [g])).at("moe", 1) == pytest.approx(24.0 * 60 / 1e3)  # 60 MoE layers
    g_bf16 = run("gemm", 3, {**params, "model.quant.method": "none"}, steps=steps)
    assert Micro(Campaign("k", "uri", [g_bf16])).at("moe", 1) == pytest.approx(168.0 * 60 / 1e3)


def test_a_failed_sweeps_measured_levels_are_used_and_said_to_be():
    """A closed-loop sweep that failed at c = 128 (its client, say) keeps c = 1, 8, 32: the
    report reads them, the run's status travels with it; a finished run wins when there is one."""
    failed = run("macro", 1, KIMI_RANK, steps={"server_tpot_ms_mean": {1: 6.8, 8: 7.4, 32: 9.4}})
    failed.status = "FAILED"
    c = Campaign("rank", "uri", [failed])
    assert c.closed_loop_macro() is failed
    sec, per = scale_out(c, dataclasses.asdict(ExternalBurst()))
    assert sorted(per) == [1, 8, 32]
    done = run("macro", 2, KIMI_RANK, steps={"server_tpot_ms_mean": {1: 6.9}})
    assert Campaign("rank", "uri", [failed, done]).closed_loop_macro() is done
    nothing = run("macro", 3, KIMI_RANK, steps={})
    nothing.status = "FAILED"
    assert Campaign("rank", "uri", [nothing]).closed_loop_macro() is None


# ---- the collectives modelled per level: α + bytes / β (nccl-tests' bus bytes) ----------

KIMI_SIZES = {"model.hidden_size": "7168", "model.vocab_size": "163840", "model.dtype_bytes": "2",
              "hardware.device_name": "NVIDIA H200"}
RANK_TPOT = {1: 6.77, 8: 7.35, 32: 9.55, 128: 17.81, 256: 32.64}  # the H200 rank, c = 1 … 256


def composed_external() -> dict:
    """experiment.scale_out.external as `experiment=report` composes it (the seed's burst on
    the seed's box, conf/hardware/rtx_pro_6000_x8_pcie.yaml)."""
    from k25exp.config.validate import to_typed
    from tests.conftest import compose_cfg

    cfg = to_typed(compose_cfg("experiment=report", "experiment.campaign=rank", "tracking=none",
                               "experiment.tracking_uri=sqlite:///unused.db"), gpu_count=lambda: 0)
    return dataclasses.asdict(cfg.experiment.scale_out.external)


def kimi_rank():
    return Campaign("rank", "uri", [run("macro", 1, {**KIMI_RANK, **KIMI_SIZES},
                                        steps={"server_tpot_ms_mean": dict(RANK_TPOT)},
                                        tags={"device_found": "NVIDIA H200"})])


def by_hand(c, beta_gbps):
    """The step's collectives at TP 8 (ms), written out: 123 all-reduces of c × 7168 × 2 B,
    each moving 2 × 7/8 of it over the bus, + the logits all-gather of 163840 × c × 2 B in
    all, 7/8 of it over the bus; α = 6.81 ms / 122 less one seed op's 14,336 B × 2 × 7/8."""
    us = lambda nbytes: nbytes / (beta_gbps * 1e9) * 1e6
    alpha = 6.81 / 122 * 1e3 - us(14336 * 2 * 7 / 8)
    ar = alpha + us(c * 14336 * 2 * 7 / 8)
    ag = alpha + us(163840 * c * 2 * 7 / 8)
    return (123 * ar + ag) / 1e3


def test_each_levels_collectives_scale_with_the_message_at_the_nominal_link():
    ext = composed_external()
    assert ext["hardware"]["name"] == "rtx_pro_6000_x8_pcie" and ext["hardware"]["link_gbps"] == 63.0
    sec, per = scale_out(kimi_rank(), ext)
    assert sorted(per) == [1, 8, 32, 128, 256]
    for c, rank in RANK_TPOT.items():
        comm = by_hand(c, 63.0)
        assert per[c][M.SCALEOUT_COMM_PRED] == pytest.approx(comm)
        assert per[c][M.SCALEOUT_TPOT_PRED] == pytest.approx(rank + comm)
        assert per[c][M.SCALEOUT_TOK_S_PRED] == pytest.approx(c / (rank + comm) * 1e3)
    # at batch 1 the model passes through the seed's burst: 124 ops at ~55.8 µs each
    assert by_hand(1, 63.0) == pytest.approx(6.81 / 122 * 124, rel=1e-3)
    # c = 128: 1,835,008 B per all-reduce; the collectives cost about twice batch 1's
    assert by_hand(128, 63.0) == pytest.approx(13.73, abs=0.01)
    table = sec.tables[0]
    rows = {r[0]: r for r in table.rows}
    assert rows[128][2] == 128 * 14336  # the all-reduce's bytes
    assert "β 63 GB/s nominal" in table.note and "PCIe Gen5 x16" in table.note
    # beside the seed's measured figures, and the rank's other GPUs said
    assert table.columns[-2:] == ["seed TPOT ms (measured)", "seed tok/s (measured)"]
    assert rows[1][-2:] == ["12–13", ""] and rows[128][-2:] == ["", 1536.0]
    assert "other GPUs: the rank ran on NVIDIA H200" in table.note
    assert "8 × NVIDIA RTX PRO 6000 Blackwell Server Edition" in table.note
    assert any(n.startswith("assumed: each collective costs α + bus bytes / β") for n in sec.notes)


def test_a_measured_allreduce_sweep_on_the_n_gpu_box_gives_beta():
    sweep = Campaign("h200x8", "uri", [
        run("allreduce_sweep", 0, {"hardware.world_size": "8", "hardware.name": "h200_x8_nvlink"},
            steps={"busbw_gbps": {1024: 5.0, 1 << 20: 40.0, 1 << 26: 120.0}})])
    sec, per = scale_out(kimi_rank(), composed_external(), lambda: sweep)
    for c, rank in RANK_TPOT.items():  # β = the busbw at the largest message, 120 GB/s
        assert per[c][M.SCALEOUT_TPOT_PRED] == pytest.approx(rank + by_hand(c, 120.0))
    assert "β 120 GB/s measured" in sec.tables[0].note
    assert any("(α; β from its allreduce_sweep)" in n for n in sec.notes)
    # a burst of the step's collectives measured on that box comes first
    sweep.runs.append(run("nccl_burst", 1, {"experiment.tokens": "1", "experiment.ops_per_step": "null",
                                            "hardware.name": "h200_x8_nvlink"}, {"burst_ms": 1.0}))
    sec, per = scale_out(kimi_rank(), composed_external(), lambda: sweep)
    assert per[1][M.SCALEOUT_TPOT_PRED] == pytest.approx(6.77 + 1.0) and sorted(per) == [1]


def test_what_only_n_gpus_can_give_is_missing_with_that_reason():
    sec, _ = scale_out(kimi_rank(), composed_external())
    gone = {f.label: f.missing for f in sec.figures if f.value is None}
    assert set(gone) == {M.SCALEOUT_BURST.label, M.SCALEOUT_SPLIT.label}
    assert all(w.startswith("missing: needs two or more GPUs (8 serving the whole model at TP 8)")
               for w in gone.values())
    bursts = Campaign("h200x8", "uri", [run("nccl_burst", 0, {"experiment.tokens": "1",
                                                              "experiment.ops_per_step": "null"},
                                            {"burst_ms": 1.0})])
    sec, _ = scale_out(kimi_rank(), composed_external(), lambda: bursts)
    assert {f.label for f in sec.figures if f.value is None} == {M.SCALEOUT_SPLIT.label}


def test_the_external_box_is_a_hardware_config_checked_like_one():
    from k25exp.config.validate import ConfigError, to_typed
    from tests.conftest import compose_cfg

    base = ("experiment=report", "experiment.campaign=rank", "tracking=none",
            "experiment.tracking_uri=sqlite:///unused.db")
    other = to_typed(compose_cfg(*base, "hardware@experiment.scale_out.external.hardware=h200_x8_nvlink"),
                     gpu_count=lambda: 0).experiment.scale_out.external.hardware
    assert (other.name, other.link_gbps, other.world_size) == ("h200_x8_nvlink", 450.0, 8)
    with pytest.raises(ConfigError, match="experiment.scale_out.external.hardware.link_gbps_source"):
        to_typed(compose_cfg(*base, "experiment.scale_out.external.hardware.link_gbps_source=a guess"),
                 gpu_count=lambda: 0)
    none = to_typed(compose_cfg(*base, "experiment.scale_out.external.hardware=null"), gpu_count=lambda: 0)
    assert none.experiment.scale_out.external.hardware is None
