"""Two torchrun agents on loopback as two "nodes": the collectives run across them and the
results are logged once, by node 0."""

from __future__ import annotations

import os
import socket
import subprocess

import pytest

from tests.conftest import ROOT, warm_python

pytestmark = pytest.mark.e2e  # starts processes end to end (pyproject's markers)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("experiment", ["nccl_burst", "all_to_all"])
def test_two_agents_two_nodes(tmp_path, experiment):
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    procs = [subprocess.Popen(
        [warm_python(), "-m", "k25exp", f"experiment={experiment}", "debug=quick",
         "hardware.nnodes=2", "hardware.nproc_per_node=1", f"hardware.node_rank={node}",
         f"hardware.rdzv_endpoint=127.0.0.1:{port}", f"paths.outputs={tmp_path / f'node{node}'}",
         f"tracking.uri=sqlite:///{tmp_path}/mlflow.db"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for node in (0, 1)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs[0][-2000:] + outs[1][-2000:]
    from mlflow.tracking import MlflowClient

    c = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    runs = c.search_runs([e.experiment_id for e in c.search_experiments()])
    assert len(runs) == 1  # logged once, by node 0
    (run,) = runs
    assert run.data.tags["world_size"] == "2" and run.data.params["hardware.nnodes"] == "2"
    key = "burst_ms" if experiment == "nccl_burst" else "a2a_us"
    assert key in run.data.metrics and run.data.metrics["wrong"] == 0
    assert "node 0 logs the results" in outs[1]
    # node 0 holds every rank's samples; node 1 only its own rank's file
    assert list((tmp_path / "node0").glob("runs/*/*/raw/gathered.jsonl"))
    assert not list((tmp_path / "node1").glob("runs/*/*/raw/gathered.jsonl"))
