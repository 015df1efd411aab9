"""The MLflow edge: runs created and filled through MlflowClient, never the fluent API.

The fluent API keeps a process-global stack of active runs, which leaks between the jobs
Hydra's basic launcher runs in one process; explicit run ids don't.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Mapping, Optional

from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

PARAM_BATCH = 100  # MLflow's limit of params per log_batch call
METRIC_BATCH = 1000  # and of metrics
PARAM_MAX_CHARS = 6000


def is_local(uri: str) -> bool:
    return uri.startswith(("sqlite:", "file:")) or "://" not in uri


def flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """{'model': {'hidden_size': 7168}} → {'model.hidden_size': '7168'}; lists as JSON."""
    out: dict[str, str] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(flatten(v, key + "."))
        elif isinstance(v, (list, tuple)):
            out[key] = json.dumps(v)
        else:
            out[key] = "null" if v is None else str(v)
    return out


class MlflowStore:
    def __init__(self, uri: str, artifact_root: Optional[str] = None):
        if uri.startswith("sqlite:///"):
            Path(uri[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
        self.uri = uri
        self.artifact_root = artifact_root if is_local(uri) else None
        self.client = MlflowClient(tracking_uri=uri)

    def experiment_id(self, name: str) -> str:
        exp = self.client.get_experiment_by_name(name)
        if exp is not None:
            return exp.experiment_id
        location = f"{Path(self.artifact_root).as_posix()}/{name}" if self.artifact_root else None
        try:
            return self.client.create_experiment(name, artifact_location=location)
        except Exception:  # created concurrently by another job
            exp = self.client.get_experiment_by_name(name)
            if exp is None:
                raise
            return exp.experiment_id

    def start_run(self, experiment_name: str, run_name: Optional[str] = None,
                  tags: Optional[Mapping[str, str]] = None,
                  parent_run_id: Optional[str] = None) -> "MlflowRun":
        all_tags = dict(tags or {})
        if parent_run_id:
            all_tags[MLFLOW_PARENT_RUN_ID] = parent_run_id
        run = self.client.create_run(self.experiment_id(experiment_name), run_name=run_name,
                                     tags=all_tags)
        return MlflowRun(self.client, run.info.run_id)

    def children(self, parent_run_id: str) -> list:
        # A sweep over experiment=a,b puts children in several MLflow experiments.
        ids = [e.experiment_id for e in self.client.search_experiments()]
        return self.client.search_runs(
            ids,
            filter_string=f"tags.`{MLFLOW_PARENT_RUN_ID}` = '{parent_run_id}'",
            max_results=10000)


class MlflowRun:
    """One MLflow run, usable as a Recorder. Metrics are buffered and sent in batches."""

    def __init__(self, client: MlflowClient, run_id: str):
        self.client, self.run_id = client, run_id
        self._metrics: list[Metric] = []

    def log_params(self, params: Mapping[str, str]) -> None:
        items = [Param(k, str(v)[:PARAM_MAX_CHARS]) for k, v in params.items()]
        for i in range(0, len(items), PARAM_BATCH):
            self.client.log_batch(self.run_id, params=items[i:i + PARAM_BATCH])

    def log_metrics(self, metrics: Mapping[str, float], step: Optional[int] = None) -> None:
        ts = int(time.time() * 1000)
        self._metrics += [Metric(k, float(v), ts, int(step or 0)) for k, v in metrics.items()]
        if len(self._metrics) >= METRIC_BATCH:
            self.flush()

    def set_tags(self, tags: Mapping[str, str]) -> None:
        if tags:
            self.client.log_batch(self.run_id, tags=[RunTag(k, str(v)[:5000]) for k, v in tags.items()])

    def flush(self) -> None:
        while self._metrics:
            batch, self._metrics = self._metrics[:METRIC_BATCH], self._metrics[METRIC_BATCH:]
            self.client.log_batch(self.run_id, metrics=batch)

    def log_artifacts(self, local_dir: Path, artifact_path: Optional[str] = None) -> None:
        self.client.log_artifacts(self.run_id, str(local_dir), artifact_path)

    def end(self, status: str = "FINISHED") -> None:
        self.flush()
        self.client.set_terminated(self.run_id, status)
