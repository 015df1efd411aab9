"""Starting real k25exp jobs as their own process group, killing them hard, reading the store."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Callable

from mlflow.tracking import MlflowClient

from k25exp.poll import wait_until
from tests.conftest import ROOT, job_env, warm_python


def env() -> dict[str, str]:
    """A job's environment, cold throughout: the process is what these tests are about, so
    torchrun and its ranks start fresh interpreters too (no K25EXP_PYTHON)."""
    e = job_env()
    e.pop("K25EXP_PYTHON", None)
    return e


def start_job(outputs: Path, run_dir: Path, *args: str, preexec_fn=None,
              warm: bool = False) -> subprocess.Popen:
    """`python -m k25exp ARGS` in a session of its own (so its whole group can be killed),
    its store under `outputs`, its run folder `run_dir`; warm: forked from the warm
    interpreter (for a test about several jobs at once, not about one job's process)."""
    python = warm_python() if warm else sys.executable
    return subprocess.Popen(
        [python, "-m", "k25exp", *args, f"paths.outputs={outputs}", f"hydra.run.dir={run_dir}"],
        cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=preexec_fn is None, preexec_fn=preexec_fn)


def kill_job_when(proc: subprocess.Popen, ready: Callable[[], bool], timeout_s: float, what: str) -> None:
    """SIGKILL the job's process group once `ready()`; the job must still be running then."""
    wait_until(lambda: ready() or proc.poll() is not None, timeout_s, 0.05, what)
    assert proc.poll() is None, f"the job ended before {what}:\n{proc.stdout.read()[-3000:]}"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)  # reaped: its pid is gone, as after a real crash
    proc.stdout.close()


def recover(uri: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "k25exp", "recover", "--uri", uri, *extra],
                          cwd=ROOT, env=env(), capture_output=True, text=True, timeout=120)


def only_run(uri: str):
    c = MlflowClient(uri)
    runs = c.search_runs([e.experiment_id for e in c.search_experiments()])
    assert len(runs) == 1, [r.info.run_name for r in runs]
    return c, runs[0]


def artifact_paths(client: MlflowClient, run_id: str, path: str = "") -> set[str]:
    out = set()
    for a in client.list_artifacts(run_id, path or None):
        out |= artifact_paths(client, run_id, a.path) if a.is_dir else {a.path}
    return out
