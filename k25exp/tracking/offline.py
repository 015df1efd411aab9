"""Offline runs: a job that cannot reach its tracking server writes a self-contained run
folder, and `k25exp sync PATH...` uploads it later, once, with its parent/child links.

The run folder is the job's Hydra output folder: everything in it becomes the run's
artifacts, plus two bookkeeping files:
  offline_run.json        id, experiment, run name, params, tags, parent, times, status
  offline_metrics.jsonl   one [key, value, timestamp_ms, step] per line
After a sync, offline_synced.json maps each store URI to the run id it got there, and the
MLflow run carries the tag k25exp.offline_id, so a second sync (even of a copied folder)
uploads nothing.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Mapping, Optional

log = logging.getLogger(__name__)

RUN_FILE = "offline_run.json"
METRICS_FILE = "offline_metrics.jsonl"
SYNCED_FILE = "offline_synced.json"
OFFLINE_ID_TAG = "k25exp.offline_id"
_BOOKKEEPING = {RUN_FILE, METRICS_FILE, SYNCED_FILE}


def _now_ms() -> int:
    return int(time.time() * 1000)


class OfflineRun:
    """Same interface as MlflowRun (a Recorder plus params, artifacts and end)."""

    def __init__(self, folder: Path, experiment_name: str, run_name: Optional[str] = None,
                 tags: Optional[Mapping[str, str]] = None, parent: Optional[dict] = None,
                 role: str = "job"):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.run_id = uuid.uuid4().hex
        self._meta = {"format": 1, "id": self.run_id, "role": role,
                      "experiment_name": experiment_name, "run_name": run_name,
                      "tags": dict(tags or {}), "params": {}, "parent": parent,
                      "start_time": _now_ms(), "end_time": None, "status": "RUNNING"}
        self._save()
        self._metrics = open(self.folder / METRICS_FILE, "a")

    def _save(self) -> None:
        tmp = self.folder / (RUN_FILE + ".tmp")
        tmp.write_text(json.dumps(self._meta, indent=1))
        tmp.replace(self.folder / RUN_FILE)  # atomic: a crash never leaves half a file

    def log_params(self, params: Mapping[str, str]) -> None:
        self._meta["params"].update({k: str(v) for k, v in params.items()})
        self._save()

    def log_metrics(self, metrics: Mapping[str, float], step: Optional[int] = None) -> None:
        ts = _now_ms()
        self._metrics.write("".join(json.dumps([k, float(v), ts, int(step or 0)]) + "\n"
                                    for k, v in metrics.items()))
        self._metrics.flush()

    def log_timed(self, points) -> None:
        """(key, value, timestamp ms, step) points taken at their own time (telemetry)."""
        self._metrics.write("".join(json.dumps([k, float(v), int(ts), int(step)]) + "\n"
                                    for k, v, ts, step in points))
        self._metrics.flush()

    def set_tags(self, tags: Mapping[str, str]) -> None:
        self._meta["tags"].update({k: str(v) for k, v in tags.items()})
        self._save()

    def flush(self) -> None:
        self._metrics.flush()

    def log_artifacts(self, local_dir: Path, artifact_path: Optional[str] = None) -> None:
        if Path(local_dir).resolve() != self.folder.resolve():
            raise ValueError(f"an offline run's artifacts are its folder {self.folder}")

    def end(self, status: str = "FINISHED") -> None:
        self._metrics.close()
        self._meta.update(status=status, end_time=_now_ms())
        self._save()


def find_runs(paths: list[Path]) -> list[Path]:
    """Offline run folders under the given paths, parents before their children."""
    found = []
    for p in paths:
        p = Path(p)
        files = [p / RUN_FILE] if (p / RUN_FILE).exists() else sorted(p.rglob(RUN_FILE))
        found += [f.parent for f in files]
    roles = {f: json.loads((f / RUN_FILE).read_text()).get("role") for f in found}
    return sorted(dict.fromkeys(found), key=lambda f: (roles[f] != "parent", str(f)))


def sync(paths: list[Path], store) -> list[tuple[Path, str, str]]:
    """Upload offline runs to `store` (an MlflowStore). Returns (folder, run id, what happened)."""
    from mlflow.entities import Metric

    done: dict[str, str] = {}  # offline id → MLflow run id, for parent links
    report = []
    for folder in find_runs(paths):
        meta = json.loads((folder / RUN_FILE).read_text())
        synced_file = folder / SYNCED_FILE
        synced = json.loads(synced_file.read_text()) if synced_file.exists() else {}
        existing = synced.get(store.uri) or _find_synced(store, meta["id"])
        if existing:
            done[meta["id"]] = existing
            report.append((folder, existing, "already synced"))
            continue
        if meta["status"] == "RUNNING":
            report.append((folder, "", "skipped: still RUNNING (or its job died; rerun sync after)"))
            continue
        parent = meta.get("parent") or {}
        parent_id = parent.get("mlflow_run_id") or done.get(parent.get("offline_id", "")) \
            or (_find_synced(store, parent["offline_id"]) if parent.get("offline_id") else None)
        run = store.start_run(meta["experiment_name"], run_name=meta["run_name"],
                              tags={**meta["tags"], OFFLINE_ID_TAG: meta["id"]},
                              parent_run_id=parent_id, start_time=meta["start_time"])
        run.log_params(meta["params"])
        metrics_path = folder / METRICS_FILE
        if metrics_path.exists():
            for line in metrics_path.read_text().splitlines():
                try:
                    k, v, ts, step = json.loads(line)
                except (ValueError, TypeError):
                    break  # a torn last line from a job that died mid-write
                run.queue_metric(Metric(k, v, ts, step))
        with tempfile.TemporaryDirectory() as tmp:  # artifacts without the bookkeeping files
            staged = Path(tmp) / "a"
            shutil.copytree(folder, staged, ignore=lambda d, names: [n for n in names if n in _BOOKKEEPING])
            run.log_artifacts(staged)
        run.end(meta["status"], end_time=meta["end_time"])
        synced[store.uri] = run.run_id
        synced_file.write_text(json.dumps(synced, indent=1))
        done[meta["id"]] = run.run_id
        report.append((folder, run.run_id, "uploaded"))
    return report


def _find_synced(store, offline_id: str) -> Optional[str]:
    ids = [e.experiment_id for e in store.client.search_experiments()]
    if not ids:
        return None
    runs = store.client.search_runs(ids, filter_string=f"tags.`{OFFLINE_ID_TAG}` = '{offline_id}'",
                                    max_results=1)
    return runs[0].info.run_id if runs else None
