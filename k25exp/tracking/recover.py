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
RECOVERED_VALIDITY = "k25exp.recovered_validity"  # macro: which levels' validity is unknown
# A recovered level's health figures: the client's loop lag and CPU use were not kept, so
# nothing shows it kept up; these are never logged as if it had.
UNKNOWN_HEALTH = ("valid", "client_lagged")
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
    """Log the figures the folder allows; returns what was recomputed, in words."""
    try:
        if (out / "raw").is_dir() and any((out / "raw").glob("rank*.jsonl")):
            return _collective_figures(out, run)
        if kind == "macro" and (out / "requests.jsonl").exists():
            return _macro_figures(out, run)
    except Exception as e:
        log.error("recomputing figures of %s failed: %s", out, e)
        return f"failed: {type(e).__name__}: {e}; files uploaded as they are"
    return f"nothing: no recovery figures for experiment {kind!r}; files uploaded as they are"


def load_typed(out: Path):
    """The job's typed config from its config.resolved.yaml (what it ran with)."""
    from omegaconf import OmegaConf

    from k25exp.config.schema import EXPERIMENT_SCHEMAS, K25Config
    from k25exp.config.validate import to_typed

    resolved = OmegaConf.load(out / "config.resolved.yaml")
    name = resolved.experiment.name
    if name not in EXPERIMENT_SCHEMAS:
        raise KeyError(f"experiment.name={name!r} in {out / 'config.resolved.yaml'}: not one of "
                       f"{sorted(EXPERIMENT_SCHEMAS)}")
    base = OmegaConf.structured(K25Config)
    base.experiment = OmegaConf.structured(EXPERIMENT_SCHEMAS[name])
    return to_typed(OmegaConf.merge(base, resolved))


def _collective_figures(out: Path, run) -> str:
    """The runner itself, replayed on raw/ instead of launching torchrun: the same result
    aggregation (k25exp.collectives.results), metrics, results table and plots."""
    from k25exp.collectives.results import read_rank_files
    from k25exp.runners import runner_for
    from k25exp.runners.collective import CollectiveFailed, replaying

    cfg = load_typed(out)
    try:
        with replaying():
            runner_for(cfg.experiment)(cfg, out, run)
    except CollectiveFailed:
        pass  # expected: the sweep did not finish; what did is logged
    files = read_rank_files(out / "raw")
    return (f"{cfg.experiment.name}: {len(files.points)} finished point(s) from raw/ "
            f"({files.incomplete_points} incomplete dropped) by the runner's own figure code "
            "(torchrun not relaunched): metrics, results.txt/.csv, plots/")


def _macro_figures(out: Path, run) -> str:
    """Per-level figures (k25exp.serving.figures) of every level requests.jsonl holds: the
    job writes a level's records once the level is over, so these are the finished ones.
    The server's /metrics view and the client's CPU and loop lag were not kept: absent. So a
    level's validity is unknown: `valid` is logged only as 0, where the records themselves
    show a delivery stall; otherwise `valid` and `client_lagged` are left out and the tag
    k25exp.recovered_validity names the levels."""
    from k25exp import plots
    from k25exp.collectives.results import read_jsonl  # a torn last line tolerated, as for ranks
    from k25exp.serving.figures import level_figures

    groups: dict[tuple[str, int], list[dict]] = {}
    for r in read_jsonl(out / "requests.jsonl"):
        groups.setdefault((r["phase"], r["level"]), []).append(r)
    levels, tput, unknown, stalled = [], [], [], []
    for (phase, level), recs in groups.items():
        if phase == "warmup":
            continue
        wall = max(r["sent_s"] + r["end_s"] for r in recs) - min(r["sent_s"] for r in recs)
        figs = {k: v for k, v in level_figures(recs, wall).items() if isinstance(v, (int, float))
                and k not in UNKNOWN_HEALTH}
        what = "single stream" if phase == "single" else f"{level}"
        if figs.get("delivery_stalls"):
            figs["valid"] = 0.0  # seen in the records: invalid whatever the client did
            stalled.append(what)
        else:
            unknown.append(what)
        if phase == "single":
            single = {f"single_stream_{k}": v for k, v in figs.items()}
            if "tpot_ms_p50" in figs:  # the job's headline names
                single["single_stream_tpot_ms"] = figs["tpot_ms_p50"]
            if "ttft_ms_p50" in figs:
                single["single_stream_ttft_ms"] = figs["ttft_ms_p50"]
            run.log_metrics(single)
        else:
            run.log_metrics(figs, step=level)
            levels.append(level)
            tput.append(figs["output_tok_s"])
    summary = {}
    if levels:
        i = max(range(len(levels)), key=tput.__getitem__)
        summary = {"peak_output_tok_s": tput[i], "peak_concurrency": levels[i]}
        run.log_metrics(summary)
        plots.sweep(out / "plots" / "throughput_vs_concurrency.png", levels,
                    {"output tok/s": tput}, "concurrency", "output tokens / s",
                    "Throughput vs concurrency (recovered: finished levels)")
    if unknown or stalled:
        run.set_tags({RECOVERED_VALIDITY: _validity_note(unknown, stalled)})
    single = ("single-stream phase, " if any(p == "single" for p, _ in groups) else "")
    return (f"macro: {single}{len(levels)} finished concurrency level(s) {levels} from "
            "requests.jsonl by k25exp.serving.figures.level_figures (no server /metrics, client "
            "CPU or loop-lag figures); plots/throughput_vs_concurrency.png")


def _validity_note(unknown: list[str], stalled: list[str]) -> str:
    def named(xs: list[str]) -> str:
        lv = [x for x in xs if x != "single stream"]
        return ", ".join((["the single stream"] if "single stream" in xs else [])
                         + ([f"levels [{', '.join(lv)}]"] if lv else []))
    parts = []
    if unknown:
        parts.append(f"validity unknown for {named(unknown)}: the client's loop lag and CPU use "
                     "were not kept, so no valid/client_lagged is logged")
    if stalled:
        parts.append(f"valid=0 for {named(stalled)}: a delivery stall in the records")
    return "; ".join(parts)
