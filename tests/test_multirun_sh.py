"""multirun.sh: phases as Hydra multiruns under one campaign tag; a failed phase doesn't stop the rest."""

from __future__ import annotations

import os
import subprocess

import pytest
from mlflow.tracking import MlflowClient

from tests.conftest import ROOT, warm_python

pytestmark = pytest.mark.e2e  # starts processes end to end (pyproject's markers)


def test_campaign_runs_phases_and_reports_failures(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "K25EXP_CAMPAIGN": "c-test",
           "PYTHON": warm_python(), "PHASES": "bogus all_to_all"}
    p = subprocess.run(["./multirun.sh", "debug=quick", f"paths.outputs={tmp_path}"], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 1  # the unknown phase failed ...
    assert "unknown phase 'bogus'" in p.stderr
    assert "1 phase(s) ok (all_to_all), 1 failed (bogus)" in p.stdout  # ... the next one ran
    c = MlflowClient(uri)
    runs = c.search_runs([e.experiment_id for e in c.search_experiments()])
    assert len(runs) == 2  # parent + one child
    assert {r.data.tags.get("campaign") for r in runs} == {"c-test"}


def test_a_mistyped_phase_prefix_stops_before_anything_runs(tmp_path):
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db", "PYTHON": warm_python()}
    p = subprocess.run(["./multirun.sh", "specdecode:experiment.num_speculative_tokens=5",
                        f"paths.outputs={tmp_path}"], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 2 and "no phase 'specdecode'" in p.stderr
    assert "=== phase" not in p.stdout and not (tmp_path / "mlflow.db").exists()


def test_a_phase_override_replaces_that_phase_s_own_sweep_of_the_key(tmp_path):
    # nccl_burst sweeps experiment.tokens=1,8,64 by default; the phase-only override wins (one
    # value: a job, where the phase's own sweep would have run three)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "K25EXP_CAMPAIGN": "c-sweep",
           "PYTHON": warm_python(), "PHASES": "nccl_burst"}
    p = subprocess.run(["./multirun.sh", "debug=quick", "experiment.communicator=torch",
                        "nccl_burst:experiment.tokens=2", f"paths.outputs={tmp_path}"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    runs = MlflowClient(uri).search_runs(
        [e.experiment_id for e in MlflowClient(uri).search_experiments()])
    tokens = sorted(int(r.data.params["experiment.tokens"]) for r in runs
                    if r.data.tags.get("k25exp.role") != "parent")
    assert tokens == [2]
