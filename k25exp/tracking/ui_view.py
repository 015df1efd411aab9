"""A saved view of MLflow's runs table per experiment: the experiment's headline figures and
the params it is swept over as the first columns, newest runs first.

MLflow's UI keeps a shared view as an experiment tag `mlflow.sharedViewState.<key>` holding
the page state as JSON (its own "Share" button writes the same), and opens it from a runs
URL with `viewStateShareKey=<key>`. k25exp writes one per experiment, keyed `k25exp-headline`
(rewritten in place when the schema's headline changed), and `k25exp ui` links to it. Columns are
MLflow's column ids: metrics.`name`, params.`name`, attributes.`Run Name`.
"""

from __future__ import annotations

import json
from typing import Optional, Sequence
from urllib.parse import quote, urlencode

TAG_PREFIX = "mlflow.sharedViewState."
KEY = "k25exp-headline"


def column(kind: str, name: str) -> str:
    return f"{kind}.`{name}`"


def view_state(headline: Sequence[str], params: Sequence[str]) -> dict:
    cols = [column("attributes", "Run Name"), *(column("metrics", m) for m in headline),
            *(column("params", p) for p in params), column("attributes", "Created"),
            column("attributes", "Duration")]
    return {"selectedColumns": cols, "columnOrder": cols, "runsHiddenMode": "SHOW_ALL",
            "orderByKey": "attributes.start_time", "orderByAsc": False}


def state_for(experiment: str) -> Optional[dict]:
    """The view of `k25exp/<experiment>`, from its schema's headline; None without one."""
    from k25exp.config.experiments import EXPERIMENT_SCHEMAS

    cls = EXPERIMENT_SCHEMAS.get(experiment.split("/", 1)[-1]) if experiment.startswith("k25exp/") else None
    if cls is None or not cls.headline:
        return None
    return view_state(cls.headline, cls.headline_params)


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


def view_url(base: str, experiment_id: str) -> str:
    q = {"viewStateShareKey": KEY, "workflowType": "machine_learning"}
    return f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs?{urlencode(q, quote_via=quote)}"
