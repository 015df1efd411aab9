"""Ends runs whose process died without ending them, with what their folder holds.

A job killed hard leaves its MLflow run RUNNING and its measurements on disk (the raw samples
are written as they are measured). Recovery, for each RUNNING run whose process is gone
(k25exp.tracking.liveness): stops what the job left running on this host (torchrun and its
ranks live in their own session, so they outlive a SIGKILL of the job), recomputes the
figures the finished part allows with the same code the job would have run, uploads the
output folder, and ends the run KILLED, tagged with why and when. It runs under the store's
lock and re-checks the status inside it, so two processes recovering at once end each run
once, and a second recovery finds nothing to do.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import psutil

from k25exp.tracking import liveness

log = logging.getLogger(__name__)

RECOVERED = "k25exp.recovered"  # when (UTC) and by which process
RECOVERED_REASON = "k25exp.recovered_reason"  # why the run's process was judged gone
RECOVERED_FIGURES = "k25exp.recovered_figures"  # what was recomputed from the folder
RECOVERED_STOPPED = "k25exp.recovered_stopped"  # processes of the job stopped on recovery
STOP_GRACE_S = 5.0


@dataclass
class Recovery:
    run_id: str
    outcome: str  # recovered | stale (dry run) | alive | already ended | failed
    detail: str = ""


def running_runs(client) -> list:
    ids = [e.experiment_id for e in client.search_experiments()]
    return client.search_runs(ids, filter_string="attributes.status = 'RUNNING'", max_results=10000)


def recover_stale(store, stale_after_s: float, dry_run: bool = False) -> list[Recovery]:
    """Recover every RUNNING run of the store whose process is gone."""
    done = []
    for r in running_runs(store.client):
        reason = liveness.gone_reason(r.data.tags, r.info.start_time, stale_after_s)
        if reason is None:
            continue
        if dry_run:
            done.append(Recovery(r.info.run_id, "stale", reason))
            continue
        try:
            done.append(recover_run(store, r.info.run_id, stale_after_s))
        except Exception as e:  # one run's recovery failing must not stop the others
            log.error("recovering run %s failed: %s", r.info.run_id, e)
            done.append(Recovery(r.info.run_id, "failed", f"{type(e).__name__}: {e}"))
    return done


def recover_run(store, run_id: str, stale_after_s: float) -> Recovery:
    with store.lock:  # re-checked inside: another process may have recovered it meanwhile
        r = store.client.get_run(run_id)
        if r.info.status != "RUNNING":
            return Recovery(run_id, "already ended", r.info.status)
        tags = r.data.tags
        reason = liveness.gone_reason(tags, r.info.start_time, stale_after_s)
        if reason is None:
            return Recovery(run_id, "alive", "its process runs")
        log.warning("run %s: %s; recovering it", run_id, reason)
        run = store.run(run_id)
        out = Path(tags["k25exp.output_dir"]) if tags.get("k25exp.output_dir") else None
        parent = tags.get("k25exp.role") == "parent"
        new_tags = {RECOVERED: f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} by "
                               f"{socket.gethostname()} pid {os.getpid()}",
                    RECOVERED_REASON: reason}
        if "error" not in tags:
            new_tags["error"] = f"killed: {reason}; recovered by k25exp"
            new_tags["error_type"] = "Killed"
        if tags.get(liveness.HOST) == socket.gethostname() and out is not None and not parent:
            stopped = stop_leftovers(out)  # before reading the folder: they still write to it
            new_tags[RECOVERED_STOPPED] = "; ".join(stopped) if stopped else "none found"
        end_ms = _last_sign_of_life_ms(tags, out if not parent else None)  # before recompute writes
        if parent:
            new_tags[RECOVERED_FIGURES] = "nothing: a multirun's parent (its jobs are runs of their own)"
        elif out is None or not out.is_dir():
            new_tags[RECOVERED_FIGURES] = f"nothing: output folder {out} is not on this host"
        else:
            new_tags[RECOVERED_FIGURES] = recompute(tags.get("k25exp.experiment", ""), out, run)
            run.flush()
            run.log_artifacts(out)
        run.set_tags(new_tags)
        run.end("KILLED", end_time=end_ms)
        return Recovery(run_id, "recovered", reason)


def _last_sign_of_life_ms(tags: dict, out: Optional[Path]) -> int:
    """When the job was last seen: its last heartbeat or the newest file it wrote."""
    t = float(tags.get(liveness.HEARTBEAT) or 0)
    if out is not None and out.is_dir():
        for p in out.rglob("*"):
            try:
                t = max(t, p.stat().st_mtime)
            except OSError:
                pass
    return int((t or time.time()) * 1000)


def names_folder(argv: list[str], folder: Path) -> bool:
    """An argument is the folder or a path inside it (…/run, not …/run2), maybe as key=value."""
    f = str(folder).rstrip("/")
    return any(a == f or a.startswith(f + "/") or a.endswith("=" + f) or f"={f}/" in a
               for a in argv)


def stop_leftovers(out: Path) -> list[str]:
    """Stop processes (with their children) whose command line names the job's output folder:
    torchrun and its ranks, in a session of their own, survive a SIGKILL of the job. Returns
    "pid name" of each one stopped."""
    found = [p for p in psutil.process_iter(["cmdline"])
             if p.pid != os.getpid() and names_folder(p.info.get("cmdline") or [], out)]
    procs, names = {}, []
    for p in found:
        try:
            for q in [p, *p.children(recursive=True)]:
                if q.pid not in procs:
                    procs[q.pid] = q
                    names.append(f"{q.pid} {q.name()}")
        except psutil.Error:
            pass
    for q in procs.values():
        try:
            q.send_signal(signal.SIGTERM)
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(list(procs.values()), timeout=STOP_GRACE_S)
    for q in alive:
        try:
            q.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=STOP_GRACE_S)
    return names


# --- figures from a folder ---------------------------------------------------------------

def recompute(kind: str, out: Path, run) -> str:
    """Log the figures the folder allows, as the experiment's schema says (its `recover`
    hook, k25exp.config.experiments; imported by name, so tracking never imports runners);
    returns what was recomputed, in words."""
    from hydra.utils import get_method

    from k25exp.config.experiments import EXPERIMENT_SCHEMAS

    schema = EXPERIMENT_SCHEMAS.get(kind)
    if schema is None:
        return f"nothing: experiment {kind!r} is not registered here; files uploaded as they are"
    if not schema.recover:
        return f"nothing: {schema.no_recovery}; files uploaded as they are"
    try:
        return get_method(schema.recover)(out, run)
    except Exception as e:
        log.error("recomputing figures of %s failed: %s", out, e)
        return f"failed: {type(e).__name__}: {e}; files uploaded as they are"
