"""Direct links into MLflow's UI, in its model-training view.

MLflow 3.x opens experiments in its GenAI view; the URL parameter
`workflowType=machine_learning` (read by the UI's experiment pages, and remembered) selects
the runs table and the run-compare view. The UI routes are hash routes:
`#/experiments/<id>/runs?...` (with `searchFilter=<MLflow search expression>`) and
`#/compare-runs?runs=[...]&experiments=[...]` (JSON lists, URL-encoded).
"""

from __future__ import annotations

import json
from typing import Optional
from urllib.parse import quote, urlencode

ML_VIEW = {"workflowType": "machine_learning"}


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
    from mlflow.tracking import MlflowClient

    from k25exp.tracking import ui_view
    from k25exp.tracking.mlflow_store import MlflowStore, child_runs

    c = MlflowStore(uri).client if write_views else MlflowClient(tracking_uri=uri)
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
    ids = [e.experiment_id for e in exps]
    recent = c.search_runs(ids, order_by=["attributes.start_time DESC"], max_results=500)
    campaign = next((r.data.tags["campaign"] for r in recent if r.data.tags.get("campaign")), None)
    if campaign:
        in_it = [r for r in recent if r.data.tags.get("campaign") == campaign]
        lines.append(f"latest campaign {campaign} ({len(in_it)} runs):")
        for eid in sorted({r.info.experiment_id for r in in_it}):
            e = next(e for e in exps if e.experiment_id == eid)
            if write_views and ui_view.install_campaign(c, eid, e.name, campaign, e.tags):
                link = ui_view.view_url(base, eid, ui_view.CAMPAIGN_KEY)
            else:
                link = runs_url(base, eid, f"tags.campaign = {chr(39)}{campaign}{chr(39)}")
            lines.append(f"  {e.name:<28} {link}")
        lines.append(f"  compare all: {compare_url(base, [r.info.run_id for r in in_it], [r.info.experiment_id for r in in_it])}")
    parents = [r for r in recent if r.data.tags.get("k25exp.role") == "parent"][:20]
    if parents:
        lines.append("sweeps (compare view of each sweep's children):")
    for p in parents:
        kids = child_runs(c, p.info.run_id)
        if len(kids) > 1:  # a compare view of one run shows nothing to compare
            lines.append(f"  {p.info.run_name or p.info.run_id[:8]} ({len(kids)} runs): "
                         + compare_url(base, [k.info.run_id for k in kids], [k.info.experiment_id for k in kids]))
    return lines
