"""One Hydra job: validate, open its MLflow run, call the runner, and close the run.

This is the only place where Hydra, MLflow and the runners meet. A job that fails is ended
FAILED with its error as a tag and whatever it wrote kept as artifacts; in a multirun the
error is recorded and the sweep goes on.
"""

from __future__ import annotations

import logging
import sys
import time
import traceback
from pathlib import Path
from typing import Optional

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from k25exp.config.validate import ConfigError, to_typed
from k25exp.envinfo import host_tags
from k25exp.runners import runner_for
from k25exp.tracking.hydra_callback import read_parent
from k25exp.tracking.recorder import MemoryRecorder

log = logging.getLogger("k25exp")

# Jobs that failed in this process; the CLI turns a non-zero count into its exit status.
failed_jobs = 0


def _open_run(cfg: DictConfig, run_name: str, tags: dict, multirun: bool):
    """The job's MlflowRun, or None with tracking=none (mlflow is then never imported)."""
    t = cfg.tracking
    if t.backend != "mlflow":
        return None
    from k25exp.tracking.mlflow_store import MlflowStore

    parent = read_parent(Path(HydraConfig.get().sweep.dir)) if multirun else None
    store = MlflowStore(t.uri, t.artifact_root)
    return store.start_run(t.experiment_name, run_name=run_name, tags=tags,
                           parent_run_id=parent["run_id"] if parent else None)


def _run_name(cfg: DictConfig, overrides: list[str]) -> str:
    if cfg.tracking.get("run_name"):
        return str(cfg.tracking.run_name)
    name = cfg.experiment.name if cfg.get("experiment") else "invalid"
    rest = [o for o in overrides if not o.startswith("experiment=")]
    return (f"{name} {' '.join(rest)}" if rest else name)[:250]


def run_job(cfg: DictConfig) -> Optional[dict]:
    global failed_jobs
    hc = HydraConfig.get()
    multirun = hc.mode == RunMode.MULTIRUN
    out = Path(hc.runtime.output_dir)
    overrides = list(hc.overrides.task)
    t_start = time.perf_counter()

    try:
        typed = to_typed(cfg)
    except ConfigError as e:
        log.error("%s", e)
        if not multirun:
            print(f"k25exp: {e}", file=sys.stderr)
            raise SystemExit(2)
        failed_jobs += 1
        _record_config_error(cfg, overrides, e)
        return None

    tags = {**host_tags(Path(typed.paths.root)), "hydra.overrides": " ".join(overrides),
            "k25exp.experiment": typed.experiment.name, "k25exp.output_dir": str(out),
            "hardware": typed.hardware.name, "model": typed.model.name}
    if typed.tracking.campaign:
        tags["campaign"] = typed.tracking.campaign
    run = _open_run(cfg, _run_name(cfg, overrides), tags, multirun)
    rec = run if run is not None else MemoryRecorder()
    resolved = OmegaConf.to_container(cfg, resolve=True)
    (out / "config.resolved.yaml").write_text(OmegaConf.to_yaml(resolved))
    if run is not None:
        from k25exp.tracking.mlflow_store import flatten

        run.log_params(flatten(resolved))
        log.info("MLflow run %s in %s", run.run_id, typed.tracking.uri)

    status, summary, error = "FINISHED", None, ""
    t_measure = time.perf_counter()
    try:
        summary = runner_for(typed.experiment)(typed, out, rec)
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    except Exception as e:
        status = "FAILED"
        failed_jobs += 1
        error = str(e)
        log.error("job failed: %s", e)
        rec.set_tags({"error": str(e), "error_type": type(e).__name__})
        (out / "error.txt").write_text(traceback.format_exc())
    finally:
        measure_s = time.perf_counter() - t_measure
        rec.log_metrics({"measure_s": measure_s, "job_s": time.perf_counter() - t_start})
        if run is not None:
            try:
                run.log_artifacts(out)
            finally:
                run.end(status)
        log.info("job %s in %.1f s (measuring %.1f s)", status.lower(),
                 time.perf_counter() - t_start, measure_s)

    if status == "FAILED" and not multirun:
        print(f"k25exp: {typed.experiment.name} failed: {error}", file=sys.stderr)
        raise SystemExit(1)
    return summary


def _record_config_error(cfg: DictConfig, overrides: list[str], err: ConfigError) -> None:
    """A multirun job with a bad config still shows up, FAILED, under its parent."""
    try:
        run = _open_run(cfg, _run_name(cfg, overrides), {"hydra.overrides": " ".join(overrides)},
                        multirun=True)
    except Exception as e:  # the tracking config itself may be what is broken
        log.error("could not record the failed job in MLflow: %s", e)
        return
    if run is not None:
        run.set_tags({"error": str(err), "error_type": "ConfigError"})
        run.end("FAILED")
