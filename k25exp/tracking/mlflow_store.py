"""The MLflow edge: runs created and filled through MlflowClient, never the fluent API (runs
are read back through read.py).

The fluent API keeps a process-global stack of active runs, which leaks between the jobs
Hydra's basic launcher runs in one process; explicit run ids don't.
"""

from __future__ import annotations

import errno
import re
import threading
import time
from pathlib import Path
from typing import Mapping, Optional

from filelock import FileLock
from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

from k25exp.tracking import ui_view
from k25exp.tracking.read import child_runs
from k25exp.tracking.sqlite_schema import check_store
from k25exp.config.store import sqlite_path


PARAM_BATCH = 100  # MLflow's limit of params per log_batch call
METRIC_BATCH = 1000  # and of metrics
PARAM_MAX_CHARS = 6000
_METRIC_KEY = re.compile(r"[\w\-. /]+")


def is_local(uri: str) -> bool:
    return uri.startswith(("sqlite:", "file:")) or "://" not in uri


_locks: dict[str, FileLock] = {}
_locks_guard = threading.Lock()


def store_lock(lock_path: Path) -> FileLock:
    """The one lock of this process for a lock file beside the SQLite database (every store
    object shares it): filelock's FileLock, an flock on Unix. Re-entrant within a thread
    (recovery holds it across calls that each take it again); exclusive between this
    process's threads (each holds its own handle: the heartbeat waits its turn) and between
    processes."""
    with _locks_guard:
        return _locks.setdefault(str(lock_path), FileLock(str(lock_path)))


class StoreFull(OSError):
    """The store's disk is full (or a file-size limit was hit): nothing more can be logged."""


# SQLite reports ENOSPC as "database or disk is full" and EFBIG (a file-size limit) as a
# disk I/O error.
_FULL = ("database or disk is full", "file too large", "no space left on device", "disk i/o error")


def _is_full(e: BaseException) -> bool:
    while e is not None:
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
            return True
        if any(m in str(e).lower() for m in _FULL):
            return True
        e = e.__cause__ or e.__context__
    return False


class _SerialisedClient:
    """MlflowClient whose calls hold the store's lock (store_lock).

    Jobs launched in parallel (joblib, submitit-local) share one SQLite file; SQLite allows
    one writer and MLflow's store gives up with "database is locked" under contention. Each
    call is short, so taking turns costs little. flock works between processes of one
    machine; several machines should share an MLflow server instead.
    """

    def __init__(self, client: MlflowClient, lock_path: Path):
        self._client, self._lock_path = client, lock_path

    @property
    def lock(self) -> FileLock:
        return store_lock(self._lock_path)

    def __getattr__(self, name: str):
        if name.startswith("__") or name in ("_client", "_lock_path"):
            raise AttributeError(name)  # unpickling (a parallel launcher's workers) asks first
        attr = getattr(self._client, name)
        if not callable(attr):
            return attr

        def locked(*args, **kwargs):
            with self.lock:
                try:
                    return attr(*args, **kwargs)
                except Exception as e:
                    if _is_full(e):
                        db = self._lock_path.with_suffix("")
                        raise StoreFull(
                            f"MLflow store {db} could not be written ({name}): the disk is "
                            f"full, a file-size limit was hit or the disk failed: {e}. The job's "
                            "output folder keeps what it measured; free space, then `k25exp "
                            "recover` uploads the folder of any run left RUNNING and ends it") from e
                    raise

        return locked


class _NullLock:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


class MlflowStore:
    def __init__(self, uri: str, artifact_root: Optional[str] = None):
        self.uri = uri
        self.artifact_root = artifact_root if is_local(uri) else None
        if (db := sqlite_path(uri)) is not None:
            db.parent.mkdir(parents=True, exist_ok=True)
            lock_path = db.with_name(db.name + ".lock")
            # Constructing the store creates and migrates a fresh schema: under the same lock
            # as every call, after checking the file is fresh or at this MLflow's revision.
            with store_lock(lock_path):
                check_store(db)
                client = MlflowClient(tracking_uri=uri)
                client._tracking_client.store  # noqa: B018  (creates the schema now, locked)
            self.client = _SerialisedClient(client, lock_path)
        else:
            self.client = MlflowClient(tracking_uri=uri)

    @property
    def lock(self):
        """The store's inter-process lock (a no-op for a server, which serialises itself)."""
        return self.client.lock if isinstance(self.client, _SerialisedClient) else _NullLock()

    def experiment_id(self, name: str) -> str:
        exp = self.client.get_experiment_by_name(name)
        if exp is not None:
            ui_view.install(self.client, exp.experiment_id, name, exp.tags)  # if it changed
            return exp.experiment_id
        location = f"{Path(self.artifact_root).as_posix()}/{name}" if self.artifact_root else None
        desc = experiment_description(name)  # shown as the experiment's description in the UI
        try:
            eid = self.client.create_experiment(name, artifact_location=location,
                                                tags={"mlflow.note.content": desc} if desc else None)
        except Exception:  # created concurrently by another job
            exp = self.client.get_experiment_by_name(name)
            if exp is None:
                raise
            return exp.experiment_id
        ui_view.install(self.client, eid, name)  # the runs view `k25exp ui` links to
        return eid

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

    def run(self, run_id: str) -> "MlflowRun":
        """An existing run, to log more to it (recovery)."""
        return MlflowRun(self.client, run_id)

    def children(self, parent_run_id: str) -> list:
        return child_runs(self.client, parent_run_id)


def experiment_description(name: str) -> Optional[str]:
    """`k25exp/<experiment>`'s schema docstring (what it measures), else None."""
    from k25exp.config.experiments import EXPERIMENT_SCHEMAS

    cls = EXPERIMENT_SCHEMAS.get(name.split("/", 1)[-1]) if name.startswith("k25exp/") else None
    doc = (cls.__doc__ or "") if cls is not None else ""
    # a dataclass without a docstring gets its signature as __doc__: not a description
    return " ".join(doc.split()) if doc and not doc.startswith(cls.__name__ + "(") else None


class MlflowRun:
    """One MLflow run, usable as a Recorder. Metrics are buffered and sent in batches."""

    def __init__(self, client: MlflowClient, run_id: str):
        self.client, self.run_id = client, run_id
        self._metrics: list[Metric] = []
        # The heartbeat thread flushes too: the buffer is handed over under this lock.
        self._buffer_lock = threading.Lock()
        self.heartbeat = None  # a liveness.Heartbeat while the run is open

    def __getstate__(self):  # a parallel launcher may pickle the run: locks and threads stay
        return {"client": self.client, "run_id": self.run_id, "_metrics": list(self._metrics)}

    def __setstate__(self, state):
        self.__init__(state["client"], state["run_id"])
        self._metrics = state["_metrics"]

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

    def log_timed(self, points) -> None:
        """(key, value, timestamp ms, step) points taken at their own time (telemetry)."""
        for k, v, ts, step in points:
            if not _METRIC_KEY.fullmatch(k):
                raise ValueError(f"metric name {k!r} has characters MLflow rejects")
            self.queue_metric(Metric(k, float(v), int(ts), int(step)))

    def queue_metric(self, metric: Metric) -> None:
        """One metric point with its own timestamp (an offline run's, when syncing)."""
        with self._buffer_lock:
            self._metrics.append(metric)
            full = len(self._metrics) >= METRIC_BATCH
        if full:
            self.flush()

    def set_tags(self, tags: Mapping[str, str]) -> None:
        if tags:
            self.client.log_batch(self.run_id, tags=[RunTag(k, str(v)[:5000]) for k, v in tags.items()])

    def flush(self) -> None:
        while True:
            with self._buffer_lock:
                batch, self._metrics = self._metrics[:METRIC_BATCH], self._metrics[METRIC_BATCH:]
            if not batch:
                return
            try:
                self.client.log_batch(self.run_id, metrics=batch)
            except BaseException:
                with self._buffer_lock:  # not sent: back in front, for the next flush or end()
                    self._metrics[:0] = batch
                raise

    def log_artifacts(self, local_dir: Path, artifact_path: Optional[str] = None) -> None:
        self.client.log_artifacts(self.run_id, str(local_dir), artifact_path)

    def end(self, status: str = "FINISHED", end_time: Optional[int] = None) -> None:
        """Flush and terminate; the run is terminated (FAILED if the flush fails) either way."""
        if self.heartbeat is not None:
            self.heartbeat.stop()
            self.heartbeat = None
        try:
            self.flush()
        except Exception:
            status = "FAILED"
            with self._buffer_lock:
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

