"""report: the campaign's synthesis from its MLflow runs (k25exp.report).

Reads the latest finished run of each phase of one campaign, computes the decode-time budget,
the step reconciled and TPOT predicted, the collectives against the link, the
expert-parallelism break-even, the speculative-decoding projection and the ITL tail by cause,
and writes
report.md (+ plots/) and a self-contained report.html into the job folder (logged with the
run) and into <paths.outputs>/reports/<campaign>/. Prints the headline table.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import shutil
import time
from pathlib import Path
from typing import Sequence

from k25exp.config.experiments import ReportConfig
from k25exp.config.schema import K25Config
from k25exp.report import (budget, context_budget, expert_parallel, link, predict, provenance,
                           reconcile, render, scale_out, spec_sweep, speculative, tail)
from k25exp.report import metrics as M
from k25exp.report.figures import Figure, Section
from k25exp.report.sources import latest_campaign, load_campaign
from k25exp.tracking.recorder import Recorder

log = logging.getLogger(__name__)


def figure_metrics(figures: Sequence[Figure]) -> dict[str, float]:
    """The figures that have a value, by their declared metric key (k25exp.report.metrics)."""
    out: dict[str, float] = {}
    for f in figures:
        if f.value is None:
            continue
        if f.key in out:  # two figures would overwrite one metric
            raise ValueError(f"two report figures log the metric {f.key!r}, the second "
                             f"{f.label!r}: give each its own key in k25exp.report.metrics")
        out[f.key] = f.value
    return out


def folder_name(campaign: str) -> str:
    """The campaign id as one safe folder name (it comes from the environment)."""
    name = re.sub(r"[^\w.-]", "_", campaign)
    return name if name.strip(".") else "campaign_" + name.replace(".", "_")


def run(cfg: K25Config, out: Path, rec: Recorder) -> dict[str, float]:
    exp: ReportConfig = cfg.experiment
    campaign = exp.campaign or latest_campaign(exp.tracking_uri)
    c, refused = provenance.check(load_campaign(exp.tracking_uri, campaign), exp.same_code)
    micro, tpot = reconcile.Micro(c), reconcile.engine_tpot(c.closed_loop_macro())  # both sections' inputs
    recon, per_c = reconcile.reconcile(c, micro, tpot)
    pred, per_level = predict.predict(c, per_c, micro, tpot)
    contexts, per_shape = context_budget.context_budget(c, micro)  # None: one request shape
    so = exp.scale_out
    scaled, per_level_tp = scale_out.scale_out(
        c, dataclasses.asdict(so.external),
        (lambda: load_campaign(exp.tracking_uri, so.collectives_campaign))
        if so.collectives_campaign else None, tpot)
    sections: list[Section] = [
        budget.decode_budget(c, exp.gemm_kernel), recon, pred, link.collectives(c),
        expert_parallel.expert_parallel(c), speculative.speculative(c),
        spec_sweep.spec_sweep(c, exp.alphas), tail.tail_section(c)]
    if scaled is not None:
        sections.insert(3, scaled)
    if contexts is not None:
        sections.insert(3, contexts)
        pred.notes.append("the newest closed-loop macro run's request shape alone; every shape "
                          f"the campaign sent: the section '{contexts.title}'")
    if refused:  # refused by name, never summed
        sections[0].notes[:0] = [str(r) for r in refused]
    macro = c.closed_loop_macro()
    if macro is not None and macro.status != "FINISHED":  # its levels stand on their own
        levels = sorted(macro.history("server_tpot_ms_mean"))
        sections[0].notes.insert(0, f"the closed-loop macro run {macro.short} {macro.status}: "
                                 f"its levels measured before that ({levels}) are used, the "
                                 "rest are missing")
    if provenance.random_weights(c):
        sections[0].notes.insert(0, "the served checkpoint has random weights (k25exp's generated "
                                 "tiny model): its figures time the architecture, not a trained "
                                 "model's routing or acceptance")
    generated = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    md, page, head = render.write(out, c, sections, exp.ui_url, generated, exp.same_code)

    figs = [f for s in sections for f in s.figures]
    summary = figure_metrics(figs)
    missing = c.missing_phases()
    summary[M.PHASES_MISSING] = len(missing)
    summary[M.FIGURES_MISSING] = sum(f.value is None for f in figs)
    rec.log_metrics(summary)
    for k, m in per_c.items():  # step = the profiled concurrency
        rec.log_metrics({M.RECON + name: v for name, v in m.items()}, step=k)
    for k, m in per_level.items():  # step = the macro level
        rec.log_metrics(m, step=k)
    for k, m in per_level_tp.items():  # step = the rank's macro level
        rec.log_metrics(m, step=k)
    for key, hist in per_shape.items():  # step = the level's concurrency, one key per shape
        for k, v in hist.items():
            rec.log_metrics({key: v}, step=k)
    if per_level:
        worst = max(abs(m[M.TPOT_PRED_ERR]) for m in per_level.values())
        rec.log_metrics({M.TPOT_PRED_ERR_MAX: worst})
        summary[M.TPOT_PRED_ERR_MAX] = worst
    summary[M.RUNS_REFUSED] = len(refused)
    rec.log_metrics({M.RUNS_REFUSED: len(refused)})
    sources = sorted({r.run_id for f in figs for r in f.runs})
    rec.set_tags({"report.campaign": campaign, "report.source_runs": " ".join(sources),
                  "report.missing_phases": " ".join(missing) or "none",
                  **{k: v for s in sections for k, v in s.tags.items()}})

    stable = Path(cfg.paths.outputs) / "reports" / folder_name(campaign)
    if stable.exists():
        shutil.rmtree(stable)
    shutil.copytree(out, stable, ignore=shutil.ignore_patterns("*.log", "*.yaml", ".hydra"))
    print(f"\ncampaign {campaign}: {len(c.runs)} phase runs"
          + (f"; missing phases: {', '.join(missing)}" if missing else ""))
    print(head)
    print(f"report: {stable / 'report.html'}\nreport (markdown): {stable / 'report.md'}", flush=True)
    return summary
