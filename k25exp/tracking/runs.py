"""Opens the run a job (or a multirun's parent) logs to: MLflow, offline, or none.

A remote MLflow server that does not answer is not a reason to lose a measurement: the job
falls back to an offline run folder (tagged with the reason) that `k25exp sync` uploads later.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Optional

log = logging.getLogger(__name__)


def server_unreachable(uri: str, timeout_s: float) -> Optional[str]:
    """Why an http(s) tracking server can't be used now, or None if it answers /health."""
    if not uri.startswith(("http://", "https://")):
        return None
    import httpx

    try:
        r = httpx.get(uri.rstrip("/") + "/health", timeout=timeout_s)
    except httpx.HTTPError as e:
        return f"{uri} unreachable: {type(e).__name__}: {e}"
    return None if r.status_code == 200 else f"{uri}/health answered HTTP {r.status_code}"


def recover_dead_runs(store, tracking) -> None:
    """End the runs of jobs killed hard (recover.py), where a user or a sweep asks for it:
    at a multirun's start (open_run's `recover`, when tracking.recover_at_multirun_start),
    `k25exp ui`, `k25exp sync` and `k25exp recover` — never at a single job's start, which
    would pay for a search of the whole store. Someone else's dead run is never a reason for
    this command to fail: errors are logged."""
    from k25exp.tracking.recover import recover_stale

    try:
        for r in recover_stale(store, tracking.stale_after_s):
            log.warning("run %s of a dead job: %s (%s)", r.run_id, r.outcome, r.detail)
    except Exception as e:
        log.warning("looking for runs of dead jobs failed: %s: %s", type(e).__name__, e)


def open_run(tracking, folder: Path, run_name: Optional[str], tags: dict,
             parent: Optional[dict] = None, role: str = "job", recover: bool = False):
    """An MlflowRun, an OfflineRun, or None (tracking=none).

    `parent` is what the multirun's parent left in the sweep folder: {"run_id": ...} for an
    MLflow parent, {"offline_id": ...} for an offline one. `recover`: first end the runs of
    dead jobs in the store (a multirun's parent asks, once per sweep; a job never does).
    """
    if tracking.backend == "none":
        return None
    reason = None
    if tracking.backend == "mlflow":
        reason = server_unreachable(tracking.uri, tracking.connect_timeout_s)
        if reason is None:
            from k25exp.config.tracking_checks import tracking_problems
            from k25exp.tracking.liveness import Heartbeat, where_tags
            from k25exp.tracking.mlflow_store import MlflowStore

            # a job's config was validated with this rule; a multirun's parent opens first
            if why := tracking_problems(tracking):
                raise ValueError("; ".join(why))
            store = MlflowStore(tracking.uri, tracking.artifact_root)
            if recover:
                recover_dead_runs(store, tracking)
            run = store.start_run(tracking.experiment_name, run_name=run_name,
                                  tags={**tags, **where_tags()},
                                  parent_run_id=(parent or {}).get("run_id"))
            if tracking.heartbeat_s and tracking.heartbeat_s > 0:
                run.heartbeat = Heartbeat(run, tracking.heartbeat_s).start()
            return run
        if not tracking.offline_fallback:
            raise ConnectionError(reason)
        log.warning("%s: logging offline to %s; upload later with `k25exp sync %s`",
                    reason, folder, folder)
        tags = {**tags, "k25exp.offline_reason": reason}
    from k25exp.tracking.offline import OfflineRun

    link = None
    if parent:
        link = {"mlflow_run_id": parent["run_id"]} if "run_id" in parent else {"offline_id": parent["offline_id"]}
    return OfflineRun(folder, tracking.experiment_name, run_name, tags, parent=link, role=role)
