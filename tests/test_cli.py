"""The `k25exp` console script: subcommands and its exit status."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

import httpx

from k25exp.poll import wait_until
from tests.conftest import ROOT


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ui_serves_the_store(tmp_path):
    port = _free_port()
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    p = subprocess.Popen([sys.executable, "-m", "k25exp", "ui", "--port", str(port), "--uri", uri],
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    try:
        def up() -> bool:
            assert p.poll() is None, "MLflow UI exited"
            return httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200

        wait_until(up, 90, 0.5, "MLflow UI answering /health", retry_on=(httpx.HTTPError,))
        r = httpx.get(f"http://127.0.0.1:{port}/api/2.0/mlflow/experiments/search?max_results=10", timeout=10)
        assert r.status_code == 200 and "experiments" in r.json()
    finally:
        os.killpg(p.pid, signal.SIGTERM)
        p.wait(timeout=30)


def test_no_experiment_is_a_clear_error(k25):
    r = k25()
    assert r.returncode == 2
    assert "no experiment selected: add experiment=NAME" in r.stderr and "nccl_burst" in r.stderr
