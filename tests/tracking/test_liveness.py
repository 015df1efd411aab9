"""Where a run runs and whether it still does: real processes, a real SQLite store."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

from k25exp.poll import wait_until
from k25exp.tracking import liveness
from k25exp.tracking.liveness import Heartbeat, gone_reason, where_tags
from k25exp.tracking.mlflow_store import MlflowStore


def test_this_process_is_alive():
    assert gone_reason(where_tags(), None, 60) is None


def test_a_dead_pid_is_gone():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    tags = where_tags(p.pid)
    p.wait()
    assert "is not running" in gone_reason(tags, None, 60)


def test_an_unreaped_child_is_gone():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    tags = where_tags(p.pid)
    wait_until(lambda: "zombie" in (gone_reason(tags, None, 60) or ""), 10, 0.05, "zombie seen")
    p.wait()


def test_a_reused_pid_is_gone():
    tags = {**where_tags(), liveness.PID_START: f"{time.time() - 86400:.3f}"}
    assert "now belongs to another process" in gone_reason(tags, None, 60)


def test_another_host_is_judged_by_its_heartbeat():
    tags = {**where_tags(), liveness.HOST: "elsewhere-" + socket.gethostname()}
    now = float(tags[liveness.HEARTBEAT])
    assert gone_reason(tags, None, 60, now=now + 30) is None
    assert "no heartbeat from elsewhere" in gone_reason(tags, None, 60, now=now + 61)


def test_runs_without_these_tags_are_left_alone():
    assert gone_reason({"host": socket.gethostname()}, 0, 60) is None


def test_heartbeat_refreshes_its_tag_and_flushes_metrics(tmp_path):
    store = MlflowStore(f"sqlite:///{tmp_path}/mlflow.db")
    run = store.start_run("k25exp/test", tags=where_tags())
    first = store.client.get_run(run.run_id).data.tags[liveness.HEARTBEAT]
    run.heartbeat = Heartbeat(run, 0.1).start()
    run.log_metrics({"x": 1.0}, step=3)  # buffered: only the heartbeat would send it now
    wait_until(lambda: store.client.get_run(run.run_id).data.metrics.get("x") == 1.0
               and store.client.get_run(run.run_id).data.tags[liveness.HEARTBEAT] != first,
               20, 0.1, "heartbeat tag refreshed and metric flushed")
    hb = run.heartbeat
    run.end("FINISHED")
    assert not hb._thread.is_alive()
    assert store.client.get_run(run.run_id).data.tags[liveness.PID] == str(os.getpid())
