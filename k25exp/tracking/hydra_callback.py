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


log = logging.getLogger(__name__)
PARENT_FILE = ".k25exp_parent_run.json"


def read_parent(sweep_dir: Path) -> Optional[dict]:
    p = sweep_dir / PARENT_FILE
    return json.loads(p.read_text()) if p.exists() else None


class MlflowParentRun(Callback):
    def __init__(self) -> None:
        self.run = None  # MlflowRun of the parent, while the sweep runs
        self.store = None

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        if config.tracking.backend != "mlflow":
            return
        from k25exp.tracking.mlflow_store import MlflowStore  # only when tracking is on

        sweep_dir = Path(config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        # Creating the store here, once, before any job, avoids jobs racing on a fresh
        # SQLite schema.
        self.store = MlflowStore(config.tracking.uri, config.tracking.artifact_root)
        tags = {"k25exp.role": "parent", "k25exp.sweep_dir": str(sweep_dir),
                "hydra.overrides": " ".join(config.hydra.overrides.task)}
        if config.tracking.campaign:
            tags["campaign"] = str(config.tracking.campaign)
        self.run = self.store.start_run(config.tracking.experiment_name,
                                        run_name=f"multirun {sweep_dir.parent.name} {sweep_dir.name}",
                                        tags=tags)
        (sweep_dir / PARENT_FILE).write_text(json.dumps(
            {"run_id": self.run.run_id, "uri": config.tracking.uri}))
        # If the sweep dies (Ctrl-C, a launcher error), don't leave the parent RUNNING.
        atexit.register(self._close, "KILLED")
        log.info("MLflow parent run %s", self.run.run_id)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if self.run is None or self.store is None:
            return
        children = self.store.children(self.run.run_id)
        failed = sum(c.info.status != "FINISHED" for c in children)
        self.run.log_metrics({"children": len(children), "failed_children": failed})
        self.run.set_tags({"k25exp.failed_children": str(failed)})
        log.info("multirun: %d jobs, %d failed (MLflow parent run %s)", len(children), failed,
                 self.run.run_id)
        self._close("FAILED" if failed else "FINISHED")

    def _close(self, status: str) -> None:
        if self.run is not None:
            run, self.run = self.run, None
            run.end(status)
