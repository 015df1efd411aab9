"""report: the campaign's synthesis from its MLflow runs (k25exp.report).

Reads the latest finished run of each phase of one campaign, computes the decode-time budget,
the expert-parallelism break-even and the speculative-decoding projection, and writes
report.md (+ plots/) and a self-contained report.html into the job folder (logged with the
run) and into <paths.outputs>/reports/<campaign>/. Prints the headline table.
"""

from __future__ import annotations

import logging
import re
import shutil
import time
from pathlib import Path

from k25exp.config.schema import K25Config, ReportConfig
from k25exp.report import budget, provenance, reconcile, render
from k25exp.report.sources import latest_campaign, load_campaign
from k25exp.tracking.recorder import Recorder

log = logging.getLogger(__name__)

# Headline figure label → metric name on the report run.
METRICS = {
    "TPOT at batch 1 (macro)": "tpot_ms",
    "communication per step (NCCL burst)": "comm_ms",
    "GEMM per step": "gemm_ms",
    "rest (attention, norms, routing, host)": "rest_ms",
    "communication share (burst / TPOT)": "comm_share_burst",
    "communication share (profile)": "comm_share_profile",
    "communication share (profile transport / TPOT)": "comm_share_profile_transport",
    "communication share (profile wait / TPOT)": "comm_share_profile_wait",
    "difference (burst − profile transport)": "comm_share_diff_pp",
    "GEMM share (GEMM / TPOT)": "gemm_share",
    "EP break-even concurrency": "ep_break_even_concurrency",
    "TPOT prediction error, worst level": "tpot_pred_err_pct_worst",
    "reconciled step": "reconciled_step_ms",
    "all-to-all knee": "a2a_knee_tokens_per_gpu",
}


def _metric_name(label: str) -> str:
    if label in METRICS:
        return METRICS[label]
    # "measured speedup, ngram k=3 (self-draft)" → "spec_measured_speedup.ngram_k3_self_draft"
    kind, _, setting = label.partition(", ")
    slug = "".join(ch if ch.isalnum() else "_" for ch in setting).strip("_")
    while "__" in slug:
        slug = slug.replace("__", "_")
    return f"spec_{kind.split()[0]}_speedup.{slug}"


def folder_name(campaign: str) -> str:
    """The campaign id as one safe folder name (it comes from the environment)."""
    name = re.sub(r"[^\w.-]", "_", campaign)
    return name if name.strip(".") else "campaign_" + name.replace(".", "_")


def run(cfg: K25Config, out: Path, rec: Recorder) -> dict[str, float]:
    exp: ReportConfig = cfg.experiment
    campaign = exp.campaign or latest_campaign(exp.tracking_uri)
    c, refused = provenance.check(load_campaign(exp.tracking_uri, campaign))
    recon, per_c = reconcile.reconcile(c)
    pred, per_level = reconcile.predict(c, per_c)
    sections = [budget.decode_budget(c, exp.gemm_kernel), recon, pred, budget.expert_parallel(c),
                budget.speculative(c, exp.alphas, exp.draft_lengths)]
    if refused:  # refused by name, never summed
        sections[0].notes[:0] = [str(r) for r in refused]
    if provenance.random_weights(c):
        sections[0].notes.insert(0, "the served checkpoint has random weights (k25exp's generated "
                                 "tiny model): its figures time the architecture, not a trained "
                                 "model's routing or acceptance")
    generated = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    md, page, head = render.write(out, c, sections, exp.ui_url, generated)

    figs = [f for s in sections for f in s.figures]
    summary = {_metric_name(f.label): f.value for f in figs if f.value is not None}
    missing = c.missing_phases()
    summary["phases_missing"] = len(missing)
    summary["figures_missing"] = sum(f.value is None for f in figs)
    rec.log_metrics(summary)
    for k, m in per_c.items():  # step = the profiled concurrency
        rec.log_metrics({f"recon.{name}": v for name, v in m.items()}, step=k)
    for k, m in per_level.items():  # step = the macro level
        rec.log_metrics(m, step=k)
    if per_level:
        worst = max(abs(m["tpot_pred_err_pct"]) for m in per_level.values())
        rec.log_metrics({"tpot_pred_err_pct_max": worst})
        summary["tpot_pred_err_pct_max"] = worst
    summary["runs_refused"] = len(refused)
    rec.log_metrics({"runs_refused": len(refused)})
    sources = sorted({r.run_id for f in figs for r in f.runs})
    rec.set_tags({"report.campaign": campaign, "report.source_runs": " ".join(sources),
                  "report.missing_phases": " ".join(missing) or "none"})

    stable = Path(cfg.paths.outputs) / "reports" / folder_name(campaign)
    if stable.exists():
        shutil.rmtree(stable)
    shutil.copytree(out, stable, ignore=shutil.ignore_patterns("*.log", "*.yaml", ".hydra"))
    print(f"\ncampaign {campaign}: {len(c.runs)} phase runs"
          + (f"; missing phases: {', '.join(missing)}" if missing else ""))
    print(head)
    print(f"report: {stable / 'report.html'}\nreport (markdown): {stable / 'report.md'}", flush=True)
    return summary
