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
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from k25exp.config.validate import ConfigError, to_typed
from k25exp.envinfo import device_check, host_tags
from k25exp.model import routing
from k25exp.redact import Redaction
from k25exp.runners import runner_for
from k25exp.tracking.hydra_callback import read_parent
from k25exp.tracking.recorder import MemoryRecorder
from k25exp.tracking.runs import open_run
from k25exp.tracking import ui_view
from k25exp.tracking.telemetry import gpu_telemetry

log = logging.getLogger("k25exp")

# Jobs that failed in this process; the CLI turns a non-zero count into its exit status.
failed_jobs = 0


@dataclass(frozen=True)
class JobConfig:
    """A job's config as everything it writes sees it, resolved and redacted once.

    Secret-named env values (HF_TOKEN ...) and tracking.redact's names are found once in the
    resolved config (`redact`); the resolved config and the command line are masked with them
    here, and the writers (Hydra's files, the run name, params, config.resolved.yaml, tags, the
    error) take these fields or `redact` itself, never walking the config for secrets again.
    """

    resolved: dict  # the resolved config, secrets masked ({} when it does not resolve)
    overrides: list[str]  # Hydra's task overrides, secrets masked
    run_name: str  # tracking.run_name, else the experiment and the overrides, masked
    redact: Redaction

    @classmethod
    def of(cls, cfg: DictConfig, overrides: list[str]) -> "JobConfig":
        try:
            resolved = OmegaConf.to_container(cfg, resolve=True)
        except Exception:  # a bad interpolation: to_typed reports it by key
            resolved = {}
        redact = Redaction.of(resolved, cfg.get("tracking", {}).get("redact") or ())
        overrides = redact.overrides(overrides)
        return cls(redact(resolved), overrides, redact(_run_name(cfg, overrides)), redact)


def _run_name(cfg: DictConfig, overrides: list[str]) -> str:
    if cfg.tracking.get("run_name"):
        return str(cfg.tracking.run_name)
    name = cfg.experiment.name if cfg.get("experiment") else "invalid"
    rest = [o for o in overrides if not o.startswith("experiment=")]
    return (f"{name} {' '.join(rest)}" if rest else name)[:250]


def _open_run(cfg: DictConfig, out: Path, run_name: str, tags: dict, multirun: bool):
    """The job's MlflowRun or OfflineRun; None with tracking=none (mlflow never imported)."""
    parent = read_parent(Path(HydraConfig.get().sweep.dir)) if multirun else None
    return open_run(cfg.tracking, out, run_name, tags, parent)


def run_job(cfg: DictConfig) -> Optional[dict]:
    global failed_jobs
    hc = HydraConfig.get()
    multirun = hc.mode == RunMode.MULTIRUN
    out = Path(hc.runtime.output_dir)
    t_start = time.perf_counter()
    job = JobConfig.of(cfg, list(hc.overrides.task))  # the only place secrets are looked for
    _scrub_hydra_files(out, job.redact)

    try:
        typed = to_typed(cfg)
    except ConfigError as e:
        e = ConfigError(job.redact(str(e)))  # a bad value may be a secret given by hand
        log.error("%s", e)
        if not multirun:
            print(f"k25exp: {e}", file=sys.stderr)
            raise SystemExit(2)
        failed_jobs += 1
        _record_config_error(cfg, job, e)
        return None

    tags = {**host_tags(Path(typed.paths.root)), "hydra.overrides": " ".join(job.overrides),
            "k25exp.experiment": typed.experiment.name, "k25exp.output_dir": str(out),
            "hardware": typed.hardware.name, "model": typed.model.name}
    if typed.tracking.campaign:
        tags["campaign"] = typed.tracking.campaign
    tags["routing"] = routing.of_config(typed)  # model.routing as this run applies it
    server = getattr(typed, "server", None)
    if why := routing.warning(tags["routing"], getattr(server, "load_format", None),
                              typed.model.n_routed_experts):
        log.warning("%s", why)
        tags["routing_warning"] = why
    dev_tags, dev_warning = device_check(typed.hardware.device, typed.hardware.device_name)
    tags.update(dev_tags)
    if dev_warning:
        log.warning("%s", dev_warning)
        tags["device_warning"] = dev_warning[:4000]
    if typed.hardware.node_rank != 0:
        # Several nodes run this same job; node 0 gathers every rank's samples and logs the
        # run once. This node only hosts its ranks.
        log.info("hardware.node_rank=%d: measuring only; node 0 logs the results",
                 typed.hardware.node_rank)
        run = None
    else:
        run = _open_run(cfg, out, job.run_name, tags, multirun)
    # the run, keeping each step_headline figure's whole sweep as a tag on the run's row
    rec = ui_view.with_step_summaries(run, typed.experiment) if run is not None else MemoryRecorder()
    (out / "config.resolved.yaml").write_text(OmegaConf.to_yaml(job.resolved))
    if run is not None:
        from k25exp.tracking.params import flatten

        run.log_params(flatten(job.resolved))
        log.info("%s run %s", type(run).__name__, run.run_id)

    status, summary, error = "FINISHED", None, ""
    t_measure = time.perf_counter()
    try:
        # NVML sampled while the runner measures, stopped and logged whatever happens
        with gpu_telemetry(typed, out, rec):
            summary = runner_for(typed.experiment)(typed, out, rec)
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    except Exception as e:
        status = "FAILED"
        failed_jobs += 1
        error = job.redact(str(e))
        log.error("job failed: %s", error)
        rec.set_tags({"error": error, "error_type": type(e).__name__})
        (out / "error.txt").write_text(job.redact(traceback.format_exc()))
    finally:
        measure_s = time.perf_counter() - t_measure
        rec.log_metrics({"measure_s": measure_s, "job_s": time.perf_counter() - t_start})
        if run is not None:
            status, error = _close_run(run, out, status, error)
        log.info("job %s in %.1f s (measuring %.1f s)", status.lower(),
                 time.perf_counter() - t_start, measure_s)

    if status == "FAILED" and not multirun:
        print(f"k25exp: {typed.experiment.name} failed: {error}", file=sys.stderr)
        raise SystemExit(1)
    return summary


def _scrub_hydra_files(out: Path, redact: Redaction) -> None:
    """Hydra saved the composed config and the command line in .hydra/ before the job ran;
    a secret given on the command line would be uploaded with the run folder."""
    if not redact.values:
        return
    for f in (out / ".hydra").glob("*.yaml"):
        text = f.read_text()
        clean = redact(text)
        if clean != text:
            f.write_text(clean)


def _close_run(run, out: Path, status: str, error: str) -> tuple[str, str]:
    """Upload the job's folder and end its run; a tracking failure fails the job, loudly."""
    global failed_jobs
    try:
        try:
            run.flush()
            run.log_artifacts(out)
        finally:
            run.end(status)
    except Exception as e:
        log.error("MLflow: %s", e)
        if status == "FINISHED":
            failed_jobs += 1
        status, error = "FAILED", error or f"tracking failed: {e}"
        try:
            run.set_tags({"error": error, "error_type": type(e).__name__})
        except Exception:
            pass
    return status, error


def _record_config_error(cfg: DictConfig, job: JobConfig, err: ConfigError) -> None:
    """A multirun job with a bad config still shows up, FAILED, under its parent."""
    try:
        out = Path(HydraConfig.get().runtime.output_dir)
        run = _open_run(cfg, out, job.run_name, {"hydra.overrides": " ".join(job.overrides)},
                        multirun=True)
    except Exception as e:  # the tracking config itself may be what is broken
        log.error("could not record the failed job in MLflow: %s", e)
        return
    if run is not None:
        run.set_tags({"error": str(err), "error_type": "ConfigError"})
        run.end("FAILED")
