"""A saved view of MLflow's runs table per experiment that lands on figures: every measured
run on its own row (a multirun's children too), newest first, the experiment's headline figures
as the first columns, a sweep inside one job (macro's levels) in one column of its row.

MLflow's UI keeps a shared view as an experiment tag `mlflow.sharedViewState.<key>` holding
the page state as JSON (its own "Share" button writes the same), and opens it from a runs
URL with `viewStateShareKey=<key>`. k25exp writes one per experiment, keyed `k25exp-headline`
(rewritten in place when the schema's headline changed), and `k25exp ui` links to it. Columns are
MLflow's column ids: metrics.`name`, params.`name`, tags.`name`, attributes.`Run Name`.

What MLflow 3.17's runs table does, and why the view is what it is (read from its UI bundle,
checked in headless Chromium, tests/tracking/test_ui_first_screen.py):
- It nests children under their parent, collapsed, whenever the table is sorted by start time
  or not sorted and not filtered; a shared view may not carry which parents are expanded
  (`runsExpanded` is one of the keys it drops). A campaign's runs then sit under collapsed
  "multirun …" rows whose headline columns read "-". So the view filters on a tag every job's
  run has and no multirun parent has (FILTER) and leaves the sort to the store (newest first):
  the table is then flat, one row per measured run. The filter shows in the search box;
  clearing it brings the parents back.
- A metric column shows one value per run, the last step's: macro's TPOT at c = 32 only. A
  run also carries, as a tag, each `step_headline` figure at every step
  (tag "tpot_ms_p50 per c" = "1:11.7 2:12.4 ..."), written as the steps are logged
  (StepSummaries); the view shows those tags right after the run's name.
- Metric cells print every digit and are cut at the column's width: the widths below keep
  the first digits and as many columns as fit beside MLflow's pinned name and date columns.
"""

from __future__ import annotations

import json
from typing import Optional, Sequence
from urllib.parse import quote, urlencode

from k25exp.tracking.read import EXPERIMENT_TAG

TAG_PREFIX = "mlflow.sharedViewState."
KEY = "k25exp-headline"
CAMPAIGN_KEY = "k25exp-campaign"  # the same view, of the latest campaign's runs only
# Every k25exp job's run has the tag EXPERIMENT_TAG (k25exp.job); a multirun's parent run has not.
FILTER = f"tags.`{EXPERIMENT_TAG}` != ''"
# Column widths, px (MLflow's default is 100 for each; the pinned name column 190)
WIDTHS = {"attributes": 120, "params": 90, "metrics": 90, "tags": 250}


def column(kind: str, name: str) -> str:
    return f"{kind}.`{name}`"


def summary_tag(figure: str, axis: str) -> str:
    """The tag holding `figure` at every step of the run's sweep ("tpot_ms_p50 per c")."""
    return f"{figure} per {axis}"


def is_summary_tag(tag: str) -> bool:
    """A tag StepSummaries writes (a result, not a fact about the environment)."""
    return " per " in tag


def view_state(headline: Sequence[str], params: Sequence[str], step_headline: Sequence[str] = (),
               step_axes: Sequence[str] = ("step",)) -> dict:
    """The runs table: run name, the per-step summaries, the params a sweep varies, the
    headline figures (those summarised too, last: their last step, sortable), created,
    duration."""
    cols = [column("attributes", "Run Name"),
            *(column("tags", summary_tag(f, a)) for f in step_headline for a in step_axes),
            *(column("params", p) for p in params),
            *(column("metrics", m) for m in headline if m not in step_headline),
            *(column("metrics", m) for m in headline if m in step_headline),
            column("attributes", "Created"), column("attributes", "Duration")]
    widths = {c: WIDTHS[c.split(".", 1)[0]] for c in cols if c.split(".", 1)[0] in WIDTHS
              and c not in (column("attributes", "Created"), column("attributes", "Duration"))}
    return {"selectedColumns": cols, "columnOrder": cols, "columnWidths": widths,
            "runsHiddenMode": "SHOW_ALL",
            # flat: filtered, and not sorted by start time (the store's order is newest first)
            "searchFilter": FILTER, "orderByKey": "", "orderByAsc": False}


def schema_of(experiment: str) -> Optional[type]:
    """The schema class of MLflow experiment `k25exp/<experiment>`, else None."""
    from k25exp.config.experiments import EXPERIMENT_SCHEMAS

    return EXPERIMENT_SCHEMAS.get(experiment.split("/", 1)[-1]) if experiment.startswith("k25exp/") else None


def state_for(experiment: str) -> Optional[dict]:
    """The view of `k25exp/<experiment>`, from its schema's headline; None without one."""
    cls = schema_of(experiment)
    if cls is None or not cls.headline:
        return None
    return view_state(cls.headline, cls.headline_params, cls.step_headline, cls.step_axes)


def install(client, experiment_id: str, experiment: str, tags: Optional[dict] = None) -> bool:
    """Write the experiment's view tag unless `tags` (the experiment's) already hold this
    one; False when the experiment has no headline."""
    state = state_for(experiment)
    if state is None:
        return False
    value = json.dumps(state)
    if (tags or {}).get(TAG_PREFIX + KEY) != value:
        client.set_experiment_tag(experiment_id, TAG_PREFIX + KEY, value)
    return True


def install_campaign(client, experiment_id: str, experiment: str, campaign: str,
                     tags: Optional[dict] = None) -> bool:
    """The same view of one campaign's runs, keyed CAMPAIGN_KEY (`k25exp ui` rewrites it for
    the latest campaign); False when the experiment has no headline."""
    state = state_for(experiment)
    if state is None:
        return False
    quoted = campaign.replace("'", "\\'")
    state["searchFilter"] = f"tags.campaign = '{quoted}' and {FILTER}"
    value = json.dumps(state)
    if (tags or {}).get(TAG_PREFIX + CAMPAIGN_KEY) != value:
        client.set_experiment_tag(experiment_id, TAG_PREFIX + CAMPAIGN_KEY, value)
    return True


def view_url(base: str, experiment_id: str, key: str = KEY) -> str:
    q = {"viewStateShareKey": key, "workflowType": "machine_learning"}
    return f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs?{urlencode(q, quote_via=quote)}"


def fmt(v: float) -> str:
    """A figure as the row shows it: 3 significant digits, no exponent below a million."""
    a = abs(v)
    if a >= 100 or a == 0:
        return f"{v:.0f}"
    return f"{v:.3g}" if a >= 0.001 else f"{v:.2e}"


class StepSummaries:
    """A Recorder around a run: passes everything on, and keeps, for each figure of the
    experiment's `step_headline`, the tag `<figure> per <axis>` = every step's value in step
    order ("1:11.7 2:12.4"), rewritten as each step is logged (a killed job keeps the steps it
    measured)."""

    def __init__(self, run, experiment):
        self._run, self._exp = run, experiment
        self._figures = tuple(type(experiment).step_headline)
        self._seen: dict[str, dict[int, float]] = {f: {} for f in self._figures}

    def log_metrics(self, metrics, step=None) -> None:
        self._run.log_metrics(metrics, step)
        if step is None:
            return
        changed = {}
        for f in self._figures:
            if f in metrics and metrics[f] is not None:
                self._seen[f][int(step)] = float(metrics[f])
                changed[summary_tag(f, self._exp.step_axis())] = " ".join(
                    f"{self._exp.step_label(s)}:{fmt(v)}" for s, v in sorted(self._seen[f].items()))
        if changed:
            self._run.set_tags(changed)

    def __getattr__(self, name: str):
        if name.startswith("__") or name in ("_run", "_exp", "_figures", "_seen"):
            raise AttributeError(name)
        return getattr(self._run, name)


def with_step_summaries(run, experiment):
    """`run` itself when the experiment has no step_headline, else StepSummaries around it."""
    return StepSummaries(run, experiment) if type(experiment).step_headline else run
