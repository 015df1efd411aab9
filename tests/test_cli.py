"""The `k25exp` console script: subcommands and its exit status."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import httpx
import psutil
import pytest

from tests.compare.browser import Chromium, chromium_path
from tests.conftest import ROOT
from tests.mlflow_ui import running_ui


@pytest.mark.e2e
def test_ui_serves_the_store_and_opens_runs_with_their_headline_columns(tmp_path):
    """`k25exp ui` on a store with a macro run: the link it prints opens MLflow's runs table
    (in Chromium, where installed) with the macro headline figures as its metric columns, in
    the schema's order, and the run's values under them (tests/tracking/test_ui_first_screen.py:
    the same on a whole campaign's store)."""
    from k25exp.config.experiments import MacroConfig
    from k25exp.tracking.mlflow_store import MlflowStore

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    # a k25exp job's run: the view lists the runs with this tag (multirun parents have none)
    run = MlflowStore(uri).start_run("k25exp/macro", run_name="macro-demo", tags={"k25exp.experiment": "macro"})
    run.log_metrics({k: 10.0 + i for i, k in enumerate(MacroConfig.headline)} | {"aaa_not_headline": 1.0})
    run.end("FINISHED")
    with running_ui(uri) as ui:
        # no MLflow job runner (its Huey consumers would stay busy beside any measurement), and
        # one UI worker: `mlflow ui` and the one uvicorn process serving (MLflow's default of 4
        # workers adds a supervisor and its 4 worker processes)
        procs = [" ".join(c.cmdline()) for c in psutil.Process(ui.proc.pid).children(recursive=True)]
        tree = " | ".join(procs)
        assert "mlflow ui" in tree and "_job_runner" not in tree and "huey" not in tree, tree[:2000]
        assert len(procs) == 2 and "--workers 1" in procs[-1], tree[:2000]
        r = httpx.get(f"http://127.0.0.1:{ui.port}/api/2.0/mlflow/experiments/search?max_results=10", timeout=10)
        assert r.status_code == 200 and "experiments" in r.json()
        # the links were printed before the server started, with the port it serves on
        link = next(w for w in ui.printed.split() if "viewStateShareKey=k25exp-headline" in w)
        assert link.startswith(f"http://127.0.0.1:{ui.port}/"), link
        if chromium_path() is None:
            return  # the browser half needs Chromium (.ci/run installs it)
        # the figures summarised per level come last (their sweep is in a tag column first)
        head = [k[:12] for k in MacroConfig.headline if k not in MacroConfig.step_headline][:4]
        with Chromium() as b:
            text, left = b.text_when(link, "macro-demo", columns=(*head, "aaa_not_head"))
        # the metric headers left to right in the declared order (where they are drawn: the
        # table's DOM order need not be its visual order), the non-headline metric not shown
        at = [left[k] for k in head]
        assert -1 not in at and at == sorted(at), (left, text[:1500])
        assert left["aaa_not_head"] == -1 and "10" in text


@pytest.mark.e2e
def test_ui_on_a_taken_port_says_so_and_starts_nothing(tmp_path):
    """A port someone listens on: `k25exp ui` names the port and its owner and exits 2 before
    any server starts (`mlflow ui` alone exits 0 there, its server's bind error in its log)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = subprocess.run([sys.executable, "-m", "k25exp", "ui", "--port", str(port),
                            "--uri", f"sqlite:///{tmp_path}/mlflow.db"],
                           cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    assert f"port {port} on 127.0.0.1 is in use (pid {os.getpid()} " in r.stderr, r.stderr
    assert "--port" in r.stderr and "mlflow ui" not in r.stdout, (r.stdout, r.stderr)


@pytest.mark.e2e
def test_ui_whose_server_stops_on_its_own_fails(tmp_path):
    """The UI's server ends while nobody stopped `k25exp ui` (here: its uvicorn process alone
    is terminated): `k25exp ui` says so and exits non-zero, where `mlflow ui` exits 0."""
    with running_ui(f"sqlite:///{tmp_path}/mlflow.db") as ui:
        server = [c for c in psutil.Process(ui.proc.pid).children(recursive=True)
                  if "uvicorn" in " ".join(c.cmdline())]
        assert len(server) == 1, [c.cmdline() for c in server]
        server[0].terminate()
        rc = ui.proc.wait(timeout=60)
        ui.reader.join(timeout=5)
    assert rc != 0 and "the MLflow UI stopped on its own" in ui.printed, (rc, ui.printed[-2000:])


def test_no_experiment_is_a_clear_error(k25):
    r = k25()
    assert r.returncode == 2
    assert "no experiment selected: add experiment=NAME" in r.stderr and "nccl_burst" in r.stderr


def test_a_bare_word_that_is_no_subcommand_is_a_clear_error(k25):
    # `k25exp report --help` was a Hydra traceback ("Error parsing override 'report'")
    r = k25("report", "--help", seed=False)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert "k25exp: 'report' is neither a subcommand (ui, sync" in r.stderr
    assert "experiment=report" in r.stderr


def test_a_server_setting_on_an_experiment_without_a_server_is_a_clear_error(k25):
    r = k25("experiment=nccl_burst", "server.port=1", seed=False)
    assert r.returncode == 2
    assert "k25exp: server.port=1: experiment=nccl_burst has no server" in r.stderr
    assert "Traceback" not in r.stderr and not (r.outputs / "mlflow.db").exists()


def test_ui_ends_the_runs_of_dead_jobs_before_showing_them(tmp_path):
    """A job killed hard left its run RUNNING; `k25exp ui` ends it KILLED (with why) before
    anyone reads the table, unless told not to."""
    from k25exp.tracking.liveness import where_tags
    from k25exp.tracking.mlflow_store import MlflowStore

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    store = MlflowStore(uri)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    tags = where_tags(gone.pid)
    gone.wait()
    dead = store.start_run("k25exp/gemm", tags={**tags, "k25exp.experiment": "gemm"}).run_id

    def ui(*extra):
        return subprocess.run([sys.executable, "-m", "k25exp", "ui", "--links-only", "--uri", uri, *extra],
                              cwd=ROOT, capture_output=True, text=True, timeout=120)

    p = ui("--no-recover")
    assert p.returncode == 0, p.stderr[-2000:]
    assert store.client.get_run(dead).info.status == "RUNNING"
    p = ui()
    assert p.returncode == 0, p.stderr[-2000:]
    assert f"k25exp ui: run {dead} of a dead job: recovered" in p.stdout
    run = store.client.get_run(dead)
    assert run.info.status == "KILLED" and "is not running" in run.data.tags["k25exp.recovered_reason"]
