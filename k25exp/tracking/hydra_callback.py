"""Hydra callback: one parent MLflow run per multirun, every job of it a child.

The parent's id is written into the sweep folder, so children find it whichever launcher
runs them (in this process, in a pool, or on SLURM nodes sharing the folder).
"""

from __future__ import annotations

import atexit
import json
import logging
from pathlib import Path
from typing import Any, Optional

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from k25exp.redact import redact_overrides


log = logging.getLogger(__name__)
PARENT_FILE = ".k25exp_parent_run.json"


def read_parent(sweep_dir: Path) -> Optional[dict]:
    p = sweep_dir / PARENT_FILE
    return json.loads(p.read_text()) if p.exists() else None


# Set by on_multirun_end: how many jobs of the last sweep failed (jobs may have run in other
# processes, so the CLI reads this rather than its own count).
last_sweep_failed: Optional[int] = None


class MlflowParentRun(Callback):
    def __init__(self) -> None:
        self.run = None  # the parent run (MlflowRun or OfflineRun) while the sweep runs
        self.sweep_dir: Optional[Path] = None

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        global last_sweep_failed
        last_sweep_failed = None
        if config.tracking.backend == "none":
            return
        from k25exp.tracking.runs import open_run  # only when tracking is on

        self.sweep_dir = Path(config.hydra.sweep.dir)
        self.sweep_dir.mkdir(parents=True, exist_ok=True)
        tags = {"k25exp.role": "parent", "k25exp.sweep_dir": str(self.sweep_dir),
                "hydra.overrides": " ".join(redact_overrides(
                    config.hydra.overrides.task, config.tracking.get("redact") or ()))}
        if config.tracking.campaign:
            tags["campaign"] = str(config.tracking.campaign)
        # Opening the store here, once, before any job, also creates a fresh SQLite schema
        # before parallel jobs could race on it, and ends the runs of jobs killed hard before
        # (once per sweep: its jobs don't look).
        self.run = open_run(config.tracking, self.sweep_dir / ".k25exp_parent",
                            f"multirun {self.sweep_dir.parent.name} {self.sweep_dir.name}", tags,
                            role="parent",
                            recover=bool(config.tracking.get("recover_at_multirun_start")))
        key = "offline_id" if type(self.run).__name__ == "OfflineRun" else "run_id"
        (self.sweep_dir / PARENT_FILE).write_text(json.dumps({key: self.run.run_id}))
        # If the sweep dies (Ctrl-C, a launcher error), don't leave the parent RUNNING.
        atexit.register(self._close, "KILLED")
        log.info("parent run %s (%s)", self.run.run_id, type(self.run).__name__)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        global last_sweep_failed
        if self.run is None:
            return
        statuses = self._children_statuses()
        failed = sum(s != "FINISHED" for s in statuses)
        last_sweep_failed = failed
        self.run.log_metrics({"children": len(statuses), "failed_children": failed})
        self.run.set_tags({"k25exp.failed_children": str(failed)})
        log.info("multirun: %d jobs, %d failed (parent run %s)", len(statuses), failed,
                 self.run.run_id)
        self._close("FAILED" if failed else "FINISHED")

    def _children_statuses(self) -> list[str]:
        if hasattr(self.run, "client"):  # MLflow: the store knows every child, any launcher
            from k25exp.tracking.read import child_runs

            return [c.info.status for c in child_runs(self.run.client, self.run.run_id)]
        from k25exp.tracking.offline import RUN_FILE  # offline: the children's run files

        metas = [json.loads(p.read_text()) for p in self.sweep_dir.glob(f"*/{RUN_FILE}")]
        return [m["status"] for m in metas if m.get("role") != "parent"]

    def _close(self, status: str) -> None:
        if self.run is not None:
            run, self.run = self.run, None
            run.end(status)
