"""Every metric the report run logs, declared once: its MLflow key beside the label and unit
people read. A figure takes its key from here, never from its label, so rewording a label
cannot rename a metric that dashboards, tests and the README rely on.

Units: every share is a percentage (0–100) of the denominator its label names, as the
profile's share_* are; a difference of two shares is in percentage points (pp, the key says
so); a key ending in _pct is a signed percentage (an error, a change)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class Metric:
    key: Optional[str]  # None: a placeholder figure that only ever says what is missing
    label: str
    unit: str = ""  # "%": a percentage (0–100) of what the label says; "pp", "pct", "ms", ...


# decode budget at batch 1
TPOT = Metric("tpot_ms", "TPOT at batch 1 (macro)", "ms")
COMM = Metric("comm_ms", "communication per step (collectives burst)", "ms")
GEMM = Metric("gemm_ms", "GEMM per step", "ms")
REST = Metric("rest_ms", "rest (attention, norms, routing, host)", "ms")
COMM_SHARE_BURST = Metric("comm_share_burst", "communication share (burst / TPOT)", "%")
COMM_SHARE_PROFILE = Metric("comm_share_profile", "communication share (profile)", "%")
COMM_SHARE_TRANSPORT = Metric("comm_share_profile_transport",
                              "communication share (profile transport / TPOT)", "%")
COMM_SHARE_WAIT = Metric("comm_share_profile_wait", "communication share (profile wait / TPOT)", "%")
COMM_SHARE_DIFF = Metric("comm_share_diff_pp", "difference (burst − profile transport)", "pp")
# the same burst timed in the server's own workers (profile's server_burst_*) splits that
# difference in two named parts: where the ops ran, and how the server's step issues them
COMM_SHARE_SERVER_BURST = Metric("comm_share_server_burst",
                                 "communication share (in-server burst transport / TPOT)", "%")
COMM_DIFF_PLACEMENT = Metric("comm_diff_placement_pp",
                             "of the difference: placement (burst − in-server burst)", "pp")
COMM_DIFF_PATTERN = Metric("comm_diff_pattern_pp",
                           "of the difference: op pattern (in-server burst − profile transport)", "pp")
GEMM_SHARE = Metric("gemm_share", "GEMM share (GEMM / TPOT)", "%")
# the step reconciled, TPOT predicted
RECONCILED = Metric("reconciled_step_ms", "reconciled step", "ms")
TPOT_PRED_WORST = Metric("tpot_pred_err_pct_worst", "TPOT prediction error, worst level", "pct")
# a campaign of several request shapes (k25exp.report.context_budget): over every measured
# (context, concurrency) point, against the engine's TPOT and, the parts without the prefills
# shared, against the level's decode-only TPOT
TPOT_CTX_PRED_WORST = Metric("tpot_ctx_pred_err_pct_worst",
                             "TPOT prediction error, worst (context, concurrency) point", "pct")
TPOT_CTX_PARTS_WORST = Metric("tpot_ctx_parts_err_pct_worst",
                              "the parts' error on the decode-only TPOT, worst (context, "
                              "concurrency) point", "pct")
# collectives against the link (value in percent, as the key says)
ALLREDUCE_LINK = Metric("allreduce_busbw_pct_of_link",
                        "all-reduce bus bandwidth at the largest size / link", "% of link")
# expert parallelism
EP_BREAK_EVEN = Metric("ep_break_even_concurrency", "EP break-even concurrency")
A2A_KNEE = Metric("a2a_knee_tokens_per_gpu", "all-to-all knee", "tokens/GPU")
# TP N predicted from one TP-N rank (k25exp.report.scale_out; campaigns of model.tp_rank_of)
SCALEOUT_TPOT_C1 = Metric("scaleout_tpot_pred_ms_c1",
                          "TPOT at TP N, batch 1, predicted (rank + collectives)", "ms")
# what only N GPUs serving the whole model can give (missing from a one-rank campaign, saying so)
SCALEOUT_BURST = Metric(None, "the step's collectives measured at TP N (nccl_burst on the N-GPU box)")
SCALEOUT_SPLIT = Metric(None, "wait / transport split of the collectives at TP N (a profile of N ranks)")
# placeholders for a missing source: never a value, never logged
A2A_SWEEP = Metric(None, "all_to_all sweep")
AR_SWEEP = Metric(None, "allreduce_sweep sweep")
SPEC_MEASURED_NONE = Metric(None, "measured speedup")
SPEC_MODEL_ERR_MAX = Metric("spec_model_err_pct_max", "speculative projection error, worst "
                            "|·| over the measured points (step model, each point from the others)",
                            "pct")

FIGURES = (TPOT, COMM, GEMM, REST, COMM_SHARE_BURST, COMM_SHARE_PROFILE, COMM_SHARE_TRANSPORT,
           COMM_SHARE_WAIT, COMM_SHARE_DIFF, COMM_SHARE_SERVER_BURST,
           COMM_DIFF_PLACEMENT, COMM_DIFF_PATTERN, GEMM_SHARE, RECONCILED, TPOT_PRED_WORST,
           TPOT_CTX_PRED_WORST, TPOT_CTX_PARTS_WORST,
           ALLREDUCE_LINK, EP_BREAK_EVEN, A2A_KNEE, SCALEOUT_TPOT_C1, SCALEOUT_BURST,
           SCALEOUT_SPLIT, A2A_SWEEP, AR_SWEEP, SPEC_MEASURED_NONE,
           SPEC_MODEL_ERR_MAX)

# Speculative decoding: one figure per measured setting, keyed by the setting's name (an
# identifier of the setting, not the figure's label).
SPEC_MEASURED = "spec_measured_speedup."


def _slug(setting: str) -> str:
    """'ngram k=3 (self-draft)' → 'ngram_k_3_self_draft'."""
    slug = "".join(ch if ch.isalnum() else "_" for ch in setting).strip("_")
    while "__" in slug:
        slug = slug.replace("__", "_")
    return slug


def spec_measured(setting: str) -> Metric:
    return Metric(SPEC_MEASURED + _slug(setting), f"measured speedup, {setting}", "×")


# Logged beside the figures by k25exp.runners.campaign_report.
PHASES_MISSING = "phases_missing"
FIGURES_MISSING = "figures_missing"
RUNS_REFUSED = "runs_refused"
TPOT_PRED_ERR_MAX = "tpot_pred_err_pct_max"  # max |error| over the macro levels
# per macro level (step = concurrency)
TPOT_PRED_MS = "tpot_pred_ms"
TPOT_PRED_ERR = "tpot_pred_err_pct"
# at a profiled level: against the TPOT of the profile's own server start without the
# profiler (the parts' model without the spread between server starts)
TPOT_PRED_ERR_SAME = "tpot_pred_err_same_server_pct"
SCALEOUT_TPOT_PRED = "scaleout_tpot_pred_ms"      # TP N predicted from one rank (scale_out)
SCALEOUT_TOK_S_PRED = "scaleout_output_tok_s_pred"  # concurrency / that TPOT
SCALEOUT_COMM_PRED = "scaleout_collectives_ms_pred"  # the step's collectives at TP N in it
# per profiled concurrency (step): the reconciliation's figures under this prefix
# (k25exp.report.reconcile), among them recon.profiler_slowdown = (profiled step +
# between-steps gap) / TPOT, the step's period under the profiler over its period without
RECON = "recon."
# per request shape of a context sweep (step = concurrency), under this prefix and ending in
# the shape (in<input tokens>_out<output tokens>): ctx.tpot_pred_ms.in512_out64,
# ctx.tpot_pred_err_pct.<shape> (against the engine's TPOT), ctx.tpot_parts_err_pct.<shape>
# (the parts without the prefills shared, against the level's decode-only TPOT)
CTX = "ctx."
