"""The report's inputs: a campaign's phase runs, read through k25exp.tracking.read as RunViews.

The arithmetic (one module per section: budget.py, reconcile.py, ...) and the rendering
(render.py) take RunViews, so tests can build them from real runs or by hand. A campaign is
every run tagged `campaign=<id>` (multirun.sh sets it for all phases); multirun parents and
report runs are not phases.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Optional

from k25exp.config.campaign import phases
from k25exp.tracking import read
from k25exp.tracking.read import RunView

log = logging.getLogger(__name__)

PHASES = tuple(phases(measuring_only=True))  # as the experiment schemas declare them
# runs that sections read though no campaign runs them as a phase (its report joins them)
READ_BESIDE = ("spec_profile",)


class ReportError(RuntimeError):
    """No campaign to report on, or the store cannot be read."""


@dataclass
class Campaign:
    id: str
    uri: str
    runs: list[RunView]

    def of(self, phase: str, status: Optional[str] = "FINISHED") -> list[RunView]:
        """The phase's runs, newest first."""
        rs = [r for r in self.runs if r.phase == phase and (status is None or r.status == status)]
        return sorted(rs, key=lambda r: r.start_time, reverse=True)

    def latest(self, phase: str, where: Callable[[RunView], bool] = lambda r: True) -> Optional[RunView]:
        return next((r for r in self.of(phase) if where(r)), None)

    def closed_loop_macro(self, where: Callable[[RunView], bool] = lambda r: True) -> Optional[RunView]:
        """The newest macro run whose levels are concurrencies (its steps), and `where`: the
        report reads TPOT per concurrency from it. An open-loop run's steps are rates × 1000.
        Without a finished one, the newest FAILED one that measured levels before it failed
        (each level stands on its own; the run's status says so, and the report's notes)."""
        def closed(r: RunView) -> bool:
            return r.params.get("experiment.load", "closed") == "closed" and where(r)
        return self.latest("macro", closed) or next(
            (r for r in self.of("macro", "FAILED") if closed(r) and r.history("server_tpot_ms_mean")),
            None)

    def why_no_closed_loop_macro(self) -> str:
        if self.latest("macro"):
            return (f"missing: campaign {self.id} has no finished closed-loop `macro` run (its "
                    "open-loop runs' levels are rates, not concurrencies)")
        return self.why_missing("macro")

    def missing_phases(self) -> list[str]:
        """Phases (in campaign order) without a finished run."""
        return [p for p in PHASES if not self.of(p)]

    def why_missing(self, phase: str, what: str = "") -> str:
        """Why there is no usable run of `phase`: failed runs named with their error."""
        bad = [r for r in self.of(phase, None) if r.status != "FINISHED"]
        base = (f"missing: no finished `{phase}` run{' ' + what if what else ''} in campaign "
                f"{self.id}")
        if not bad:
            return base
        r = bad[0]
        err = r.tags.get("error", "").strip().splitlines()
        return (base + f"; {len(bad)} run(s) {'/'.join(sorted({b.status for b in bad}))}, latest "
                f"{r.short}" + (f": {err[-1][:200]}" if err else ""))


def latest_campaign(uri: str) -> str:
    """The campaign tag of the most recently started phase run in the store."""
    c = read.client(uri)
    ids = read.experiment_ids(c)
    if not ids:
        raise ReportError(f"no experiments in the MLflow store {uri}")
    for r in read.recent_runs(c, ids):
        # phase runs only: a report run (of an old campaign, or a mistyped id) decides nothing
        if not r.is_parent and r.tags.get("campaign") and r.phase in PHASES:
            return r.tags["campaign"]
    raise ReportError(f"no run in {uri} has a campaign tag: run ./multirun.sh, or set "
                      "K25EXP_CAMPAIGN=<id> for the runs of one campaign")


def load_campaign(uri: str, campaign: str) -> Campaign:
    """Every phase run of the campaign (parents and reports left out)."""
    runs = [r for r in read.campaign_runs(read.client(uri), campaign)
            if r.phase in PHASES or r.phase in READ_BESIDE]
    if not runs:
        raise ReportError(f"campaign {campaign!r} has no phase runs in {uri} (phases: "
                          f"{', '.join(PHASES)})")
    log.info("campaign %s: %d phase runs", campaign, len(runs))
    return Campaign(campaign, uri, runs)
