"""The MLflow read side: runs in the store as plain RunView objects, the queries that find them
(a run, a sweep's children, a campaign's runs, the newest runs), their metric histories and
their artifacts.

k25exp.report and k25exp.compare read the store only through this module and take RunViews,
so their tests build runs from a real store or by hand; ui_links.py reads through it too.
MLflow is imported inside the functions: importing this module (the report's and compare's
modules do) costs nothing, and tracking=none never imports mlflow.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Callable, Mapping, Optional

# What k25exp tags a run with (k25exp.job, tracking/hydra_callback.py) and reads back here.
EXPERIMENT_TAG = "k25exp.experiment"  # the k25exp experiment of a job's run
ROLE_TAG = "k25exp.role"  # "parent" on a multirun's parent run
RECENT = 500  # how many of the newest runs `recent_runs` reads


@dataclass
class RunView:
    run_id: str
    experiment_id: str
    phase: str
    status: str  # FINISHED | FAILED | KILLED | RUNNING
    start_time: int  # ms since the epoch
    name: str = ""
    params: dict[str, str] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)  # last value of each
    tags: dict[str, str] = field(default_factory=dict)
    # name -> {step: value}; filled on demand by `history` (MLflow keeps every step)
    steps: dict[str, dict[int, float]] = field(default_factory=dict)
    loader: Optional[Callable[[str, str], dict[int, float]]] = field(default=None, repr=False)

    def history(self, key: str) -> dict[int, float]:
        if key not in self.steps:
            self.steps[key] = self.loader(self.run_id, key) if self.loader else {}
        return self.steps[key]

    def param(self, key: str, cast=str, default=None):
        v = self.params.get(key)
        if v is None or v in ("null", "None"):
            return default
        return cast(v)

    @property
    def short(self) -> str:
        return self.run_id[:8]

    @property
    def is_parent(self) -> bool:
        """A multirun's parent run (it measures nothing; its children do)."""
        return is_parent(self.tags)


def is_parent(tags: Mapping[str, str]) -> bool:
    return tags.get(ROLE_TAG) == "parent"


def client(uri: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def experiment_ids(c) -> list[str]:
    return [e.experiment_id for e in c.search_experiments()]


def history(c, run_id: str, key: str) -> dict[int, float]:
    """{step: value} of every step of a metric (a step logged twice: its latest value)."""
    return {m.step: m.value for m in sorted(c.get_metric_history(run_id, key),
                                             key=lambda m: m.timestamp)}


def views(c, runs) -> list[RunView]:
    """MLflow runs (mlflow.entities.Run) as RunViews whose `history` reads the store through c."""
    loader = partial(history, c)
    return [RunView(r.info.run_id, r.info.experiment_id, r.data.tags.get(EXPERIMENT_TAG, ""),
                    r.info.status, r.info.start_time or 0, r.info.run_name or "",
                    dict(r.data.params), dict(r.data.metrics), dict(r.data.tags), loader=loader)
            for r in runs]


def run(c, run_id: str) -> Optional[RunView]:
    """The run with this id; None where the store has none (or the id is not one)."""
    from mlflow.exceptions import MlflowException

    try:
        return views(c, [c.get_run(run_id)])[0]
    except MlflowException:
        return None


def child_runs(c, parent_run_id: str) -> list:
    """The children of a multirun's parent run, as MLflow runs."""
    from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

    # A sweep over experiment=a,b puts children in several MLflow experiments.
    return c.search_runs(experiment_ids(c), filter_string=f"tags.`{MLFLOW_PARENT_RUN_ID}` = "
                         f"'{parent_run_id}'", max_results=10000)


def children(c, parent_run_id: str) -> list[RunView]:
    return views(c, child_runs(c, parent_run_id))


def campaign_runs(c, campaign: str) -> list[RunView]:
    """Every run tagged `campaign=<campaign>` but the multirun parents, in the store's order."""
    ids = experiment_ids(c)
    found = c.search_runs(ids, filter_string=f"tags.campaign = '{campaign}'",
                          max_results=10000) if ids else []
    return [r for r in views(c, found) if not r.is_parent]


def recent_runs(c, ids: Optional[list[str]] = None) -> list[RunView]:
    """The RECENT newest runs of the store (of experiments `ids`), newest first; none
    without experiments."""
    ids = experiment_ids(c) if ids is None else ids
    if not ids:
        return []
    return views(c, c.search_runs(ids, order_by=["attributes.start_time DESC"],
                                  max_results=RECENT))


def download_artifact(uri: str, run_id: str, path: str, dst: Path) -> None:
    """The run's artifact `path` (a file or a folder) into folder `dst`: a file lands at
    dst/<its basename>. Raises where the run kept no such artifact."""
    from mlflow.artifacts import download_artifacts

    download_artifacts(run_id=run_id, artifact_path=path, dst_path=str(dst), tracking_uri=uri)
