"""Direct links into MLflow's UI, in its model-training view.

MLflow 3.x opens experiments in its GenAI view; the URL parameter
`workflowType=machine_learning` (read by the UI's experiment pages, and remembered) selects
the runs table and the run-compare view. The UI routes are hash routes:
`#/experiments/<id>/runs?...` (with `searchFilter=<MLflow search expression>`) and
`#/compare-runs?runs=[...]&experiments=[...]` (JSON lists, URL-encoded); one run's page is
`#/experiments/<id>/runs/<run id>` (the report and compare link each figure's run there).
The store is read through read.py.
"""

from __future__ import annotations

import json
from typing import Optional
from urllib.parse import quote, urlencode

from k25exp.tracking import read, ui_view
from k25exp.tracking.read import RunView

ML_VIEW = {"workflowType": "machine_learning"}


def run_url(ui_url: str, r: RunView) -> str:
    return f"{ui_url.rstrip('/')}/#/experiments/{r.experiment_id}/runs/{r.run_id}"


def runs_url(base: str, experiment_id: str, search: Optional[str] = None) -> str:
    q = {**ML_VIEW, **({"searchFilter": search} if search else {})}
    return f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs?{urlencode(q, quote_via=quote)}"


def compare_url(base: str, run_ids: list[str], experiment_ids: list[str]) -> str:
    q = {"runs": json.dumps(run_ids), "experiments": json.dumps(sorted(set(experiment_ids))), **ML_VIEW}
    return f"{base.rstrip('/')}/#/compare-runs?{urlencode(q, quote_via=quote)}"


def ui_links(uri: str, base: str, write_views: bool = False) -> list[str]:
    """Lines to print: each experiment's runs table, the latest campaign's runs, and a compare
    view of each sweep's children (newest sweeps first, at most 10).

    write_views: first bring each k25exp experiment's saved view up to this k25exp's
    (k25exp.tracking.ui_view; a store written by an older one gets the current columns) and
    write each experiment's view of the latest campaign, so its link lands on the campaign's
    figures too (a URL's own searchFilter would make MLflow ignore a saved view)."""
    from k25exp.tracking.mlflow_store import MlflowStore  # imports mlflow: only when called

    c = MlflowStore(uri).client if write_views else read.client(uri)
    exps = c.search_experiments()
    if not exps:
        return [f"no experiments in {uri} yet"]
    if write_views:
        for e in exps:
            ui_view.install(c, e.experiment_id, e.name, e.tags)
        exps = c.search_experiments()

    lines = ["experiments (runs table, model-training view: every measured run on its own row, "
             "newest first, its headline figures as the first columns, where the experiment has "
             "a saved k25exp view):"]
    lines += [f"  {e.name:<28} " + (ui_view.view_url(base, e.experiment_id)
                                   if ui_view.TAG_PREFIX + ui_view.KEY in e.tags else runs_url(base, e.experiment_id))
              for e in exps]
    recent = read.recent_runs(c, [e.experiment_id for e in exps])
    campaign = next((r.tags["campaign"] for r in recent if r.tags.get("campaign")), None)
    if campaign:
        in_it = [r for r in recent if r.tags.get("campaign") == campaign]
        lines.append(f"latest campaign {campaign} ({len(in_it)} runs):")
        for eid in sorted({r.experiment_id for r in in_it}):
            e = next(e for e in exps if e.experiment_id == eid)
            if write_views and ui_view.install_campaign(c, eid, e.name, campaign, e.tags):
                link = ui_view.view_url(base, eid, ui_view.CAMPAIGN_KEY)
            else:
                link = runs_url(base, eid, f"tags.campaign = {chr(39)}{campaign}{chr(39)}")
            lines.append(f"  {e.name:<28} {link}")
        lines.append(f"  compare all: {compare_url(base, [r.run_id for r in in_it], [r.experiment_id for r in in_it])}")
    parents = [r for r in recent if r.is_parent][:20]
    if parents:
        lines.append("sweeps (compare view of each sweep's children):")
    for p in parents:
        kids = read.children(c, p.run_id)
        if len(kids) > 1:  # a compare view of one run shows nothing to compare
            lines.append(f"  {p.name or p.short} ({len(kids)} runs): "
                         + compare_url(base, [k.run_id for k in kids], [k.experiment_id for k in kids]))
    return lines
