"""GPU telemetry around a job's measurement, logged to its run (k25exp.telemetry does the
sampling and the verdicts; this is the edge that starts it from the config and logs it).

Why timed metrics and not MLflow's system metrics: those need the fluent API's active run
(k25exp logs through explicit run ids), sample every 10 s by default, do not run for an
offline run (the GPU machine logs offline) and say nothing about throttling or sharing.

What a run gets (hardware.device=cuda, nvidia-ml-py importable):
  tags      telemetry (what was sampled, or why nothing), telemetry.throttled,
            telemetry.gpu_shared, telemetry.sm_clock_ref, telemetry.errors
  metrics   telemetry.* summary figures (k25exp.telemetry.summary)
  series    telemetry/gpu<i>/<quantity>: one point per window of whole seconds (the mean),
            with the window's own timestamp; step = seconds since sampling began
  artifacts telemetry.csv (every sample), telemetry_processes.csv (every process check)
"""

from __future__ import annotations

import csv
import logging
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Optional

from k25exp.tracking.recorder import Recorder

log = logging.getLogger(__name__)

PROCESS_CHECK_S = 1.0  # listing a GPU's processes and walking /proc costs ~ms: once a second


def _import_nvml() -> Any:
    import pynvml  # nvidia-ml-py

    return pynvml


def start(cfg: Any, nvml: Any = None):
    """A started NvmlSampler, or (None, why not) — never an exception: a run measures the
    same without telemetry, and its tag says so."""
    hw = cfg.hardware
    period_ms = getattr(hw, "telemetry_period_ms", 100.0)
    if hw.device != "cuda":
        return None, f"off (hardware.device={hw.device})"
    if not period_ms or period_ms <= 0:
        return None, "off (hardware.telemetry_period_ms=0)"
    if not getattr(type(cfg.experiment), "measures", True):
        return None, f"off ({cfg.experiment.name} measures nothing)"
    if nvml is None:
        try:
            nvml = _import_nvml()
        except ImportError:
            return None, ("unavailable: nvidia-ml-py (pynvml) is not importable here "
                          "(pip install 'k25exp[gpu]')")
    from k25exp.telemetry.nvml_sampler import NvmlSampler, job_gpus

    engine, engine_note = served_engine(cfg)
    try:
        nvml.nvmlInit()  # a probe: which GPUs, before the sampler opens its own session
        try:
            gpus, note = job_gpus(nvml, hw.nproc_per_node, os.environ.get("CUDA_VISIBLE_DEVICES"))
        finally:
            nvml.nvmlShutdown()
        if not gpus:
            return None, f"off: no GPU to sample ({note})"
        sampler = NvmlSampler(nvml, gpus, period_ms / 1e3, PROCESS_CHECK_S, engine_pids=engine,
                              engine_note=engine_note).start()
    except Exception as e:  # no driver, NVML too old, a GPU that went away
        return None, f"unavailable: NVML failed: {type(e).__name__}: {e}"
    names = sorted({g.name for g in sampler.gpus})
    version = getattr(nvml, "__version__", None) or _dist_version()
    sampler.note = (f"nvml ({version}) every {period_ms:g} ms on GPU "
                    f"{', '.join(str(g.index) for g in sampler.gpus)} ({', '.join(names)}); {note}")
    return sampler, None


def served_engine(cfg: Any) -> tuple[frozenset[int], Optional[str]]:
    """The processes of the server a serving job attached to (server=endpoint), when it runs on
    this host: on the GPU they are the engine being measured, not another tenant. Looked up
    once, before the job measures. (frozenset(), None) for a job that launches its server (its
    tree is the job's) or measures no server (a GEMM job beside a running server shares the
    GPU with it). A lookup that fails finds nothing and says why: the job measures all the same."""
    from k25exp.config.experiments import MacroConfig, ProfileConfig
    from k25exp.telemetry.procs import served_engine as lookup

    if getattr(cfg.server, "kind", None) != "endpoint" or not isinstance(
            cfg.experiment, (MacroConfig, ProfileConfig)):
        return frozenset(), None
    try:
        pids, note = lookup(cfg.server.base_url)
    except Exception as e:
        return frozenset(), f"not found: the lookup failed: {type(e).__name__}: {e}"
    return frozenset(pids), note


def _dist_version() -> str:
    try:
        from importlib.metadata import version

        return "nvidia-ml-py " + version("nvidia-ml-py")
    except Exception:
        return "nvidia-ml-py"


def finish(sampler, out: Path, rec: Recorder) -> None:
    """Stop the sampler, write the CSVs into the run folder, log figures, series and tags."""
    from k25exp.telemetry.summary import CSV_COLUMNS, PROCESS_COLUMNS, summarize

    result = sampler.stop()
    rep = summarize(result)
    out.mkdir(parents=True, exist_ok=True)
    _write_csv(out / "telemetry.csv", CSV_COLUMNS, rep.csv_rows)
    _write_csv(out / "telemetry_processes.csv", PROCESS_COLUMNS, rep.process_rows)
    rec.set_tags({"telemetry": f"{sampler.note}; {result.ticks} ticks", **rep.tags})
    rec.log_metrics(rep.metrics)
    rec.log_timed(rep.series)
    for w in rep.warnings:
        log.warning("%s", w)


def _write_csv(path: Path, columns: list[str], rows: list[list]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(columns)
        w.writerows(rows)


@contextmanager
def gpu_telemetry(cfg: Any, out: Path, rec: Recorder, nvml: Any = None) -> Iterator[Optional[Any]]:
    """Samples the job's GPUs while the body runs; stops, writes and logs on success and on
    failure alike. A telemetry failure is a tag (telemetry.error), never the job's error."""
    sampler, why_not = start(cfg, nvml)
    if sampler is None:
        rec.set_tags({"telemetry": why_not})
    try:
        yield sampler
    finally:
        if sampler is not None:
            try:
                finish(sampler, out, rec)
            except Exception as e:
                log.warning("GPU telemetry: %s: %s", type(e).__name__, e)
                try:
                    rec.set_tags({"telemetry.error": f"{type(e).__name__}: {e}"[:4000]})
                except Exception:
                    pass
