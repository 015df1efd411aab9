"""The MLflow edge: runs created and filled through MlflowClient, never the fluent API.

The fluent API keeps a process-global stack of active runs, which leaks between the jobs
Hydra's basic launcher runs in one process; explicit run ids don't.
"""

from __future__ import annotations

import fcntl
import re
import time
from pathlib import Path
from typing import Mapping, Optional

from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID


PARAM_BATCH = 100  # MLflow's limit of params per log_batch call
METRIC_BATCH = 1000  # and of metrics
PARAM_MAX_CHARS = 6000
_METRIC_KEY = re.compile(r"[\w\-. /]+")


def is_local(uri: str) -> bool:
    return uri.startswith(("sqlite:", "file:")) or "://" not in uri


class _SerialisedClient:
    """MlflowClient whose calls hold an exclusive lock on a file beside the SQLite database.

    Jobs launched in parallel (joblib, submitit-local) share one SQLite file; SQLite allows
    one writer and MLflow's store gives up with "database is locked" under contention, and a
    fresh store's schema creation races ("duplicate column"). Each call is short, so taking
    turns costs little. flock works between processes of one machine; several machines
    should share an MLflow server instead.
    """

    def __init__(self, client: MlflowClient, lock_path: Path):
        self._client, self._lock_path = client, lock_path

    def __getattr__(self, name: str):
        if name.startswith("__") or name in ("_client", "_lock_path"):
            raise AttributeError(name)  # unpickling (a parallel launcher's workers) asks first
        attr = getattr(self._client, name)
        if not callable(attr):
            return attr

        def locked(*args, **kwargs):
            with open(self._lock_path, "a") as f:
                fcntl.flock(f, fcntl.LOCK_EX)
                try:
                    return attr(*args, **kwargs)
                finally:
                    fcntl.flock(f, fcntl.LOCK_UN)

        return locked


class MlflowStore:
    def __init__(self, uri: str, artifact_root: Optional[str] = None):
        self.uri = uri
        self.artifact_root = artifact_root if is_local(uri) else None
        client = MlflowClient(tracking_uri=uri)
        if uri.startswith("sqlite:///"):
            db = Path(uri[len("sqlite:///"):])
            db.parent.mkdir(parents=True, exist_ok=True)
            client = _SerialisedClient(client, db.with_name(db.name + ".lock"))
        self.client = client

    def experiment_id(self, name: str) -> str:
        exp = self.client.get_experiment_by_name(name)
        if exp is not None:
            return exp.experiment_id
        location = f"{Path(self.artifact_root).as_posix()}/{name}" if self.artifact_root else None
        desc = experiment_description(name)  # shown as the experiment's description in the UI
        try:
            return self.client.create_experiment(name, artifact_location=location,
                                                 tags={"mlflow.note.content": desc} if desc else None)
        except Exception:  # created concurrently by another job
            exp = self.client.get_experiment_by_name(name)
            if exp is None:
                raise
            return exp.experiment_id

    def start_run(self, experiment_name: str, run_name: Optional[str] = None,
                  tags: Optional[Mapping[str, str]] = None,
                  parent_run_id: Optional[str] = None,
                  start_time: Optional[int] = None) -> "MlflowRun":
        all_tags = dict(tags or {})
        if parent_run_id:
            all_tags[MLFLOW_PARENT_RUN_ID] = parent_run_id
        run = self.client.create_run(self.experiment_id(experiment_name), run_name=run_name,
                                     tags=all_tags, start_time=start_time)
        return MlflowRun(self.client, run.info.run_id)

    def children(self, parent_run_id: str) -> list:
        return child_runs(self.client, parent_run_id)


def experiment_description(name: str) -> Optional[str]:
    """`k25exp/<experiment>`'s schema docstring (what it measures), else None."""
    from k25exp.config.schema import EXPERIMENT_SCHEMAS

    cls = EXPERIMENT_SCHEMAS.get(name.split("/", 1)[-1]) if name.startswith("k25exp/") else None
    doc = (cls.__doc__ or "") if cls is not None else ""
    # a dataclass without a docstring gets its signature as __doc__: not a description
    return " ".join(doc.split()) if doc and not doc.startswith(cls.__name__ + "(") else None


def child_runs(client, parent_run_id: str) -> list:
    # A sweep over experiment=a,b puts children in several MLflow experiments.
    ids = [e.experiment_id for e in client.search_experiments()]
    return client.search_runs(ids, filter_string=f"tags.`{MLFLOW_PARENT_RUN_ID}` = '{parent_run_id}'",
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
        # Checked here, not at flush: one bad key would make MLflow reject the whole batch.
        bad = [k for k in metrics if not _METRIC_KEY.fullmatch(k)]
        if bad:
            raise ValueError(f"metric names {bad} have characters MLflow rejects "
                             "(allowed: letters, digits, _ - . / and space)")
        ts = int(time.time() * 1000)
        for k, v in metrics.items():
            self.queue_metric(Metric(k, float(v), ts, int(step or 0)))

    def queue_metric(self, metric: Metric) -> None:
        """One metric point with its own timestamp (an offline run's, when syncing)."""
        self._metrics.append(metric)
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

    def end(self, status: str = "FINISHED", end_time: Optional[int] = None) -> None:
        """Flush and terminate; the run is terminated (FAILED if the flush fails) either way."""
        try:
            self.flush()
        except Exception:
            status = "FAILED"
            self._metrics.clear()
            raise
        finally:
            self.client.set_terminated(self.run_id, status, end_time=end_time)

    def child(self, run_name: str, tags: Optional[Mapping[str, str]] = None) -> "MlflowRun":
        """A nested run under this one (a search's probe), in the same experiment; the caller
        ends it."""
        exp_id = self.client.get_run(self.run_id).info.experiment_id
        r = self.client.create_run(exp_id, run_name=run_name,
                                   tags={"mlflow.parentRunId": self.run_id, **(tags or {})})
        return MlflowRun(self.client, r.info.run_id)

