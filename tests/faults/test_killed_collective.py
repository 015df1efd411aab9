"""A collective job SIGKILLed mid-sweep: the next k25exp command ends its run KILLED with the
finished points' figures and the raw samples.

What happens to the processes: the job runs torchrun in a session of its own, so killing the
job's process group leaves torchrun and its ranks running; they go on measuring into the run
folder until a rank's next progress line hits the pipe the dead job no longer reads
(BrokenPipeError), which ends them within a point or so. Recovery does not count on that: it
stops every process whose command line names the run folder before it reads the folder, and
lists them in the tag k25exp.recovered_stopped ("none found" when they had already ended).
"""

from __future__ import annotations

import subprocess
import sys
import time

import psutil
import pytest

from k25exp.collectives.results import read_rank_files
from k25exp.tracking.mlflow_store import MlflowStore
from k25exp.tracking.recover import names_folder, recover_stale, stop_leftovers
from tests.conftest import ROOT
from tests.faults.helpers import artifact_paths, env, kill_job_when, only_run, start_job

pytestmark = pytest.mark.e2e  # starts processes end to end (pyproject's markers)


def _has_point(path) -> bool:
    return path.exists() and '"kind": "point"' in path.read_text().replace('"kind":"point"', '"kind": "point"')


def _left(folder) -> list:
    return [p.pid for p in psutil.process_iter(["cmdline"])
            if names_folder(p.info["cmdline"] or [], folder)]


def test_sigkill_mid_sweep_then_recover(tmp_path):
    outputs, run_dir = tmp_path / "outputs", tmp_path / "run"
    uri = f"sqlite:///{outputs}/mlflow.db"
    job = start_job(outputs, run_dir, "experiment=allreduce_sweep", "debug=quick",
                    "experiment.limit_points=null", "experiment.min_bytes=1024",
                    "experiment.max_bytes=16777216", "experiment.bursts=20",
                    "experiment.communicator=torch")
    kill_job_when(job, lambda: _has_point(run_dir / "raw" / "rank0.jsonl"), 120,
                  "rank 0 wrote its first point")
    t_kill = time.time()
    torchrun_survived = bool(_left(run_dir))
    c, run = only_run(uri)
    assert run.info.status == "RUNNING"  # nobody ended it

    # Two recoveries at once: the store lock and the status re-checked inside it make one win.
    both = [subprocess.Popen([sys.executable, "-m", "k25exp", "recover", "--uri", uri], cwd=ROOT,
                             env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for _ in range(2)]
    outs = [p.communicate(timeout=120)[0] for p in both]
    t_recovered = time.time()
    assert all(p.returncode == 0 for p in both), outs
    assert sum("1 recovered" in o for o in outs) == 1, outs
    assert not _left(run_dir), "a process of the killed job is still running"

    run = c.get_run(run.info.run_id)
    tags = run.data.tags
    assert run.info.status == "KILLED"
    assert "is not running" in tags["k25exp.recovered_reason"]
    assert tags["k25exp.recovered"].startswith(time.strftime("%Y-", time.gmtime()))
    assert "finished point(s) from raw/" in tags["k25exp.recovered_figures"]
    assert tags["error"].startswith("killed: process")
    assert tags["k25exp.recovered_stopped"]
    files = read_rank_files(run_dir / "raw")
    assert files.points, "no finished point to recover"
    steps = sorted(m.step for m in c.get_metric_history(run.info.run_id, "busbw_gbps"))
    assert steps == sorted(p.nbytes for p in files.points)
    assert len(steps) < 15, "the sweep finished before recovery: nothing was cut short"
    assert run.data.params["experiment.name"] == "allreduce_sweep"  # logged before the kill
    arts = artifact_paths(c, run.info.run_id)
    assert {"raw/rank0.jsonl", "raw/rank1.jsonl", "raw/torchrun.log", "config.resolved.yaml",
            "results.txt", "plots/busbw_vs_size.png"} <= arts, arts
    assert run.info.end_time <= int(time.time() * 1000)
    print("recovered run's k25exp tags:", {k: v for k, v in tags.items()
                                           if k.startswith(("k25exp.recover", "k25exp.host", "k25exp.pid",
                                                            "k25exp.heartbeat", "error"))})
    print("metrics:", sorted(run.data.metrics))
    print(f"recovered run: status {run.info.status}, {len(steps)} points, artifacts {sorted(arts)}, "
          f"torchrun survived the kill: {torchrun_survived}, stopped on recovery: "
          f"{tags['k25exp.recovered_stopped']}, kill to recovered: {t_recovered - t_kill:.1f} s")

    assert recover_stale(MlflowStore(uri), 900) == []  # idempotent: nothing left to do
    assert c.get_run(run.info.run_id).info.end_time == run.info.end_time
    assert stop_leftovers(run_dir) == []
