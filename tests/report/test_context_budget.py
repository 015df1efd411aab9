"""TPOT across context and concurrency on hand-built runs: three request shapes served, two of
them profiled, the third predicted from the fit; every expectation computed by hand in the
comments beside it."""

from __future__ import annotations

import pytest

import k25exp.runners.campaign_report as runner
from k25exp.config.validate import to_typed
from k25exp.report import context_budget, reconcile
from k25exp.report.sources import Campaign
from k25exp.tracking import MemoryRecorder
from tests.conftest import compose_cfg
from tests.report.test_reconcile import DENSE_GEMMS, run

# the uncovered attention: exactly 0.5 ms + 0.01 ms per sequence + 0.1 µs per sequence·token
# of context; idle 1.0 ms, the collectives' wait 0.2 ms, the host gap 0.3 ms everywhere
A, B, E = 0.5, 0.01, 1e-4
STEP = 10.0  # every profile's decode step, ms: a part's share is its ms × 10 %


def attention(c, ctx):
    return A + B * c + E * c * ctx


def shape(n_in, n_out=64):
    return {"experiment.input_tokens": str(n_in), "experiment.output_tokens": str(n_out)}


def profile(t, n_in, k, prefill_us=None):
    ctx = n_in + 32
    metrics = {"decode_step_ms": STEP, "share_comm_allreduce": 10.0, "share_gemm_dense": 10.0,
               "share_moe": 10.0, "share_attention": attention(k, ctx) / STEP * 100,
               "share_idle": 1.0 / STEP * 100, "comm_transport_ms_per_step": 0.5,
               "comm_wait_ms_per_step": 0.2, "between_steps_ms": 0.3}
    if prefill_us is not None:
        metrics["prefill_us_per_token"] = prefill_us
    return run("profile", t, {"experiment.concurrency": str(k), **shape(n_in)}, metrics)


def macro(t, n_in, tpot, **steps):
    return run("macro", t, shape(n_in), steps={"server_tpot_ms_mean": tpot, **steps})


def campaign(shapes=(128, 512, 1536)) -> Campaign:
    """Micro-benchmarks measured at 1 and 8 tokens (as test_reconcile's campaign): the
    collectives' burst 1.0 / 2.0 ms, each of the 21 dense GEMMs 10 / 20 µs, the fused MoE
    call 50 / 100 µs in each of 2 MoE layers: 1.31 ms at c = 1, 2.62 ms at c = 8, and at c = 4
    (log-log between them, every one doubling from 1 to 8 tokens) 1.31 × 2^(2/3)."""
    bursts = [run("nccl_burst", t, {"experiment.tokens": str(tok), "experiment.ops_per_step": "null",
                                    "experiment.communicator": "vllm"}, {"burst_ms": b})
              for t, (tok, b) in enumerate([(1, 1.0), (8, 2.0)])]
    gemm_steps = {f"{n}.tp2/torch_bf16/latency_us": {1: 10.0, 8: 20.0} for n in DENSE_GEMMS}
    gemm_steps["moe.tp2/vllm_fused_moe/latency_us"] = {1: 50.0, 8: 100.0}
    gemm = run("gemm", 10, {"experiment.tp": "2", "experiment.baseline": "torch_bf16",
                            "experiment.graph": "False"}, steps=gemm_steps)
    runs = bursts + [gemm]
    # profiled: 128 and 512 prompts (contexts 160 and 544) at c = 1 and 8; 1536 is not
    for i, (n_in, k) in enumerate([(128, 1), (128, 8), (512, 1), (512, 8)]):
        runs.append(profile(20 + i, n_in, k, prefill_us=80.0 if n_in == 512 else None))
    if 128 in shapes:
        runs.append(macro(30, 128, {1: 3.0, 8: 4.8},
                          prefill_tokens_per_decode_step={1: 0.0, 8: 0.0}))
    if 512 in shapes:
        # one level with a slope of its own: no other level of its shape to price c = 8 from,
        # so the profiles' prefill steps at 512 price it
        runs.append(macro(31, 512, {1: 3.1, 8: 5.5},
                          prefill_tokens_per_decode_step={1: 0.0, 8: 4.0},
                          prefill_shared_us_per_token={8: 25.0}, prefill_fit_n={8: 32.0}))
    if 1536 in shapes:
        # a length distribution centred on 1536: its c = 8 requests measured 1500 on average
        runs.append(macro(32, 1536, {1: 3.5, 4: 5.0, 8: 6.0},
                          input_len_mean={1: 1536.0, 4: 1536.0, 8: 1500.0},
                          output_len_mean={1: 64.0, 4: 64.0, 8: 64.0},
                          prefill_tokens_per_decode_step={1: 0.0, 4: 5.0, 8: 10.0},
                          prefill_shared_us_per_token={4: 20.0, 8: 30.0},
                          prefill_fit_n={4: 16.0, 8: 32.0},
                          decode_only_tpot_ms={1: 3.5, 4: 4.7, 8: 5.8},
                          output_tok_s={1: 280.0, 4: 790.0, 8: 1300.0}))
    return Campaign("ctx", "uri", runs)


def points(c):
    sec, out = context_budget.context_budget(c, reconcile.Micro(c))
    return sec, out


def test_every_context_and_concurrency_is_predicted_from_the_fit_and_the_other_levels():
    sec, out = points(campaign())
    key = "ctx.tpot_pred_ms.in1536_out64"
    pred, err = out[key], out["ctx.tpot_pred_err_pct.in1536_out64"]
    # 1536 / 64 at c = 8: never profiled. micro 2.62; attention at c = 8 and its requests'
    # context 1500 + 32 = 1532: 0.5 + 0.08 + 1e-4 × 8 × 1532 = 1.8056, + idle 1.0 + wait 0.2
    # + gap 0.3 = 3.3056; prefills: 10 tokens × c = 4's 20 µs (not its own 30) = 0.2 ms
    # → 6.1256 ms against 6.0 measured: +2.0933 %
    assert pred[8] == pytest.approx(2.62 + 3.3056 + 0.2)
    assert err[8] == pytest.approx((6.1256 - 6.0) / 6.0 * 100)
    # the parts without the prefills (5.9256) against the decode-only TPOT 5.8: +2.1655 %
    assert out["ctx.tpot_parts_err_pct.in1536_out64"][8] == pytest.approx((5.9256 - 5.8) / 5.8 * 100)
    # c = 4, held out in c too: micro 1.31 × 2^(2/3); attention 0.5 + 0.04 + 1e-4 × 4 × 1568
    # = 1.1672, + 1.5; prefills 5 tokens × c = 8's 30 µs = 0.15 ms
    assert pred[4] == pytest.approx(1.31 * 2 ** (2 / 3) + 1.1672 + 1.5 + 0.15)
    # c = 1: 1.31 + (0.5 + 0.01 + 0.1568) + 1.5 + no prefill = 3.4768
    assert pred[1] == pytest.approx(3.4768)
    # a profiled point: 128 / 64 at c = 8 is the fit's value there, exact here
    # (0.5 + 0.08 + 1e-4 × 8 × 160 = 0.708): 2.62 + 0.708 + 1.5 = 4.828
    assert out["ctx.tpot_pred_ms.in128_out64"][8] == pytest.approx(4.828)
    # 512 at c = 8: 4 tokens × the profiles' prefill steps at 512 (80 µs, no other level's
    # slope) = 0.32 ms; + 2.62 + (0.5 + 0.08 + 0.4352) + 1.5 = 5.1352 → 5.4552
    assert out["ctx.tpot_pred_ms.in512_out64"][8] == pytest.approx(5.4552)

    rows = {(r[0], r[2]): r for r in sec.tables[2].rows}
    row = rows[("1536 / 64 tokens", 8)]
    assert row[1] == pytest.approx(1532.0) and row[4] == 1300.0  # context per step, tok/s
    assert row[14] == "fit over 4 profiled points (a + b·c + e·c·ctx)"
    assert row[16] == "other levels" and row[17] == 30.0  # its own slope, beside, not used
    assert rows[("512 / 64 tokens", 8)][16] == "profiles' prefill steps"
    # the grid: shapes down, concurrencies across; a level not measured is empty
    grid = sec.tables[0]
    assert grid.columns == ["prompt / output tokens", "c = 1", "c = 4", "c = 8"]
    # 128 at c = 1: 1.31 + (0.5 + 0.01 + 0.016) + 1.5 = 3.336 against 3.0: +11.2 %
    assert grid.rows[0][:3] == ["128 / 64 tokens", "3.000 / 3.336 (+11.2 %)", None]
    # the fit's table: attention's coefficients recovered from the four profiles
    fit = {r[0]: r for r in sec.tables[3].rows}
    assert fit["attention"][1:4] == pytest.approx([A, B, E])
    worst = max((v for k, h in out.items() if "pred_err" in k for v in h.values()), key=abs)
    assert sec.figures[0].value == pytest.approx(worst)
    assert sec.plot["series"]["predicted, 1536 in"][2] == pytest.approx(6.1256)


def test_one_request_shape_is_not_a_context_sweep():
    assert points(campaign(shapes=(512,))) == (None, {})


def test_profiles_of_one_context_are_interpolated_in_c_and_held_at_that_context():
    c = campaign()
    c = Campaign(c.id, c.uri, [r for r in c.runs if not (r.phase == "profile" and
                                                         r.params["experiment.input_tokens"] == "512")])
    sec, out = points(c)
    # 1536 at c = 8: attention at 128's c = 8 profile, 0.708 ms (held at context 160)
    # → 2.62 + 0.708 + 1.5 + 0.2 = 5.028
    assert out["ctx.tpot_pred_ms.in1536_out64"][8] == pytest.approx(5.028)
    assert "profiles hold one context (160 tokens)" in sec.notes[0]
    row = next(r for r in sec.tables[2].rows if r[0] == "1536 / 64 tokens" and r[2] == 4)
    assert row[14] == "interpolated in c; context held at the one profiled (160 tokens)"


def test_the_report_logs_each_shape_and_keeps_the_single_shape_sections_on_the_newest(tmp_path, monkeypatch):
    c = campaign()
    monkeypatch.setattr(runner, "load_campaign", lambda uri, campaign_id: c)
    cfg = to_typed(compose_cfg("experiment=report", "experiment.campaign=ctx", "tracking=none",
                               "experiment.tracking_uri=sqlite:///unused.db",
                               f"paths.outputs={tmp_path}"), gpu_count=lambda: 0)
    rec = MemoryRecorder()
    summary = runner.run(cfg, tmp_path / "job", rec)
    logged = {(k, step): v for k, v, step in rec.metrics}
    assert logged[("ctx.tpot_pred_ms.in1536_out64", 8)] == pytest.approx(6.1256)
    assert "tpot_ctx_pred_err_pct_worst" in summary
    md = (tmp_path / "job" / "report.md").read_text()
    assert "## TPOT across context and concurrency" in md
    assert "| TPOT prediction error, worst (context, concurrency) point |" in md.split("## ")[1]
    # the single-shape sections read the newest macro run (1536) and its shape's profiles:
    # none here, so the reconciliation falls back to the others' (and says so)
    assert "every shape the campaign sent: the section 'TPOT across context and concurrency'" in md


def test_a_point_whose_macro_level_was_flagged_says_so():
    """The macro flags a level invalid (client lag, a delivery stall): its point keeps its
    prediction against the engine's TPOT and says 'invalid' in the grid, 'no' in the table,
    and the worst-point figure names it."""
    c = campaign()
    m = next(r for r in c.runs if r.phase == "macro" and r.params["experiment.input_tokens"] == "1536")
    m.steps["valid"] = {1: 1.0, 4: 1.0, 8: 0.0}
    sec, out = points(c)
    grid = {r[0]: r for r in sec.tables[0].rows}
    assert grid["1536 / 64 tokens"][3].endswith(" invalid")
    assert not grid["1536 / 64 tokens"][1].endswith("invalid")
    assert not grid["128 / 64 tokens"][1].endswith("invalid")  # no flag logged: nothing said
    table = sec.tables[2]
    col = table.columns.index("valid (macro level)")
    by = {(r[0], r[2]): r[col] for r in table.rows}
    assert by[("1536 / 64 tokens", 8)] == "no" and by[("1536 / 64 tokens", 4)] == "yes"
    assert by[("128 / 64 tokens", 8)] is None
    assert sec.figures[0].note.endswith(
        "1 flagged invalid by their macro level (the run's why column): 1536 / 64 tokens c = 8")
    assert out["ctx.tpot_pred_ms.in1536_out64"][8] == pytest.approx(6.1256)  # still predicted


def test_the_in_server_burst_is_pooled_over_every_shapes_server_start():
    """On a CPU communicator (the burst's transport budgeted) each profile timed the burst in
    its own server start's workers. The messages depend on c, not on the context, so every
    shape takes the median over all shapes' profiles at that c, not its own start's alone."""
    c = campaign()
    c.runs.append(profile(24, 1536, 1))  # a third start at c = 1 (the fit stays exact)
    own = {(128, 1): 0.6, (512, 1): 1.8, (1536, 1): 0.9, (128, 8): 1.0, (512, 8): 1.4}
    for r in c.runs:
        if r.phase == "nccl_burst":
            r.metrics["burst_transport_ms"] = r.metrics["burst_ms"] * 0.6
        if r.phase == "profile":
            r.metrics["server_burst_transport_ms"] = own[
                (r.param("experiment.input_tokens", int), r.param("experiment.concurrency", int))]
    sec, out = points(c)
    # median at c = 1 of 0.6, 1.8, 0.9 = 0.9 (the mean would be 1.1); at c = 8 of 1.0, 1.4 = 1.2
    # 512 at c = 1, its own start's burst 1.8 not used: 0.9 + GEMMs 0.21 + MoE 0.1 + attention
    # (0.5 + 0.01 + 1e-4 × 544) + 1.5 = 3.2744
    pred = {s: out[f"ctx.tpot_pred_ms.in{s}_out64"] for s in (128, 512, 1536)}
    assert pred[512][1] == pytest.approx(0.9 + 0.31 + 0.5644 + 1.5)
    assert pred[128][1] == pytest.approx(0.9 + 0.31 + 0.526 + 1.5)
    # 1536 at c = 8: 1.2 + 0.42 + 0.2 + 3.3056 + prefills 0.2 = 5.3256
    assert pred[1536][8] == pytest.approx(5.3256)
    # 1536 at c = 4, between the profiled c: 0.9 + (1.2 − 0.9) × 3 / 7
    col = sec.tables[2].columns.index("collectives")
    row = next(r for r in sec.tables[2].rows if r[0] == "1536 / 64 tokens" and r[2] == 4)
    assert row[col] == pytest.approx(0.9 + 0.3 * 3 / 7)
    assert ("c = 1: 0.900 ms, n = 3 (0.600–1.800); c = 8: 1.200 ms, n = 2 (1.000–1.400)"
            in sec.notes[0])
