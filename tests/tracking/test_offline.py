"""Offline runs: written without a server, uploaded once by `k25exp sync` with their links."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys

import pytest
from mlflow.tracking import MlflowClient

from tests.conftest import LIGHT_JOB, LIGHT_METRIC, ROOT, warm_python

pytestmark = pytest.mark.e2e  # starts processes end to end (pyproject's markers)


def sync(*args):
    return subprocess.run([warm_python(), "-m", "k25exp", "sync", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def all_runs(uri):
    c = MlflowClient(uri)
    return c, c.search_runs([e.experiment_id for e in c.search_experiments()], max_results=100)


def test_offline_multirun_synced_twice_appears_once(k25, tmp_path):
    r = k25("-m", "tracking=offline", *LIGHT_JOB, "experiment.calls=2,3")
    assert r.returncode == 0, r.stderr[-3000:]
    assert not (r.outputs / "mlflow.db").exists()  # nothing reached a store
    (sweep,) = r.outputs.glob("multiruns/*/*")
    uri = f"sqlite:///{tmp_path}/central/mlflow.db"
    first = sync(sweep, "--uri", uri)
    assert first.returncode == 0, first.stderr
    assert "3 uploaded, 0 already there" in first.stdout
    c, runs = all_runs(uri)
    (parent,) = [x for x in runs if x.data.tags.get("k25exp.role") == "parent"]
    children = [x for x in runs if x.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(runs) == 3 and len(children) == 2
    assert parent.data.metrics == {"children": 2.0, "failed_children": 0.0}
    for ch in children:
        assert ch.info.status == "FINISHED" and LIGHT_METRIC in ch.data.metrics
        assert ch.data.params["model.name"] == "tiny_kimi"  # set by the test's overrides
        assert sorted(m.step for m in c.get_metric_history(ch.info.run_id, LIGHT_METRIC)) == [1, 2]
        arts = {a.path for a in c.list_artifacts(ch.info.run_id)}
        assert {"config.resolved.yaml", "samples.jsonl", "results.csv"} <= arts
        assert not arts & {"offline_run.json", "offline_metrics.jsonl"}
        assert ch.info.start_time < ch.info.end_time
    assert sorted(int(ch.data.params["experiment.calls"]) for ch in children) == [2, 3]

    again = sync(sweep, "--uri", uri)
    assert "0 uploaded, 3 already there" in again.stdout
    # a copy of the folder (its sync marker dropped) is recognised by the run's offline id
    copy = tmp_path / "copy"
    shutil.copytree(sweep, copy)
    for marker in copy.rglob("offline_synced.json"):
        marker.unlink()
    assert "0 uploaded, 3 already there" in sync(copy, "--uri", uri).stdout
    assert len(all_runs(uri)[1]) == 3


def test_unreachable_server_falls_back_to_offline(k25, tmp_path):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = k25(*LIGHT_JOB, f"tracking.uri=http://127.0.0.1:{port}", "tracking.connect_timeout_s=2")
    assert r.returncode == 0, r.stderr[-3000:]
    (folder,) = [p.parent for p in r.outputs.glob("runs/*/*/offline_run.json")]
    uri = f"sqlite:///{tmp_path}/later.db"
    assert "1 uploaded" in sync(folder, "--uri", uri).stdout
    (run,) = all_runs(uri)[1]
    assert f"127.0.0.1:{port} unreachable" in run.data.tags["k25exp.offline_reason"]
    assert LIGHT_METRIC in run.data.metrics


def test_sync_refuses_a_missing_folder(tmp_path):
    r = sync(tmp_path / "nope")
    assert r.returncode == 2 and "no such folder" in r.stderr


def test_offline_job_runs_where_mlflow_is_not_installed(tmp_path):
    # GPU nodes run k25exp without MLflow: blocking its import must not break an offline job
    code = ("import sys, runpy; sys.modules['mlflow'] = None; "
            f"sys.argv = ['k25exp', 'experiment=nccl_burst', 'debug=quick', 'tracking=offline', 'experiment.communicator=torch', "
            f"'paths.outputs={tmp_path}']; runpy.run_module('k25exp', run_name='__main__')")
    cold = {k: v for k, v in os.environ.items() if k != "K25EXP_PYTHON"}  # its ranks too
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=cold, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    (run,) = [f.parent for f in tmp_path.glob("runs/*/*/offline_run.json")]
    assert "experiment.ops_per_step" in (run / "offline_run.json").read_text()
