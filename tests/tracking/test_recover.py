"""Recovery on a real SQLite store, with runs whose process is really gone (or not)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from k25exp.tracking import liveness
from k25exp.tracking.liveness import where_tags
from k25exp.tracking.mlflow_store import MlflowStore
from k25exp.tracking.recover import names_folder, recover_stale


def _dead_pid_tags() -> dict:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    tags = where_tags(p.pid)
    p.wait()
    return tags


def test_names_folder_matches_the_folder_and_paths_inside_only():
    f = Path("/x/runs/12-00-00")
    assert names_folder(["torchrun", "/x/runs/12-00-00/raw/spec.json"], f)
    assert names_folder(["python", "hydra.run.dir=/x/runs/12-00-00"], f)
    assert not names_folder(["torchrun", "/x/runs/12-00-001/raw/spec.json"], f)


def test_dead_runs_end_killed_live_ones_are_left(tmp_path):
    store = MlflowStore(f"sqlite:///{tmp_path}/mlflow.db", str(tmp_path / "art"))
    out = tmp_path / "job"
    (out / "sub").mkdir(parents=True)
    (out / "sub" / "partial.csv").write_text("a,b\n1,2\n")
    dead = store.start_run("k25exp/gemm", tags={**_dead_pid_tags(), "k25exp.output_dir": str(out),
                                                "k25exp.experiment": "gemm"})
    alive = store.start_run("k25exp/gemm", tags=where_tags())
    far = store.start_run("k25exp/gemm", tags={**where_tags(), liveness.HOST: "another-host",
                                               liveness.HEARTBEAT: "1000.0",
                                               "k25exp.output_dir": "/nowhere/here"})
    legacy = store.start_run("k25exp/gemm")  # logged before where-tags existed

    done = {r.run_id: r for r in recover_stale(store, stale_after_s=60)}
    assert set(done) == {dead.run_id, far.run_id}
    assert {r.outcome for r in done.values()} == {"recovered"}
    c = store.client
    d = c.get_run(dead.run_id)
    assert d.info.status == "KILLED"
    assert "no recovery figures for experiment 'gemm'" in d.data.tags["k25exp.recovered_figures"]
    assert d.data.tags["k25exp.recovered_stopped"] == "none found"
    assert [a.path for a in c.list_artifacts(dead.run_id, "sub")] == ["sub/partial.csv"]
    f = c.get_run(far.run_id)
    assert f.info.status == "KILLED" and "no heartbeat from another-host" in f.data.tags["error"]
    assert "not on this host" in f.data.tags["k25exp.recovered_figures"]
    assert c.get_run(alive.run_id).info.status == "RUNNING"
    assert c.get_run(legacy.run_id).info.status == "RUNNING"
    assert recover_stale(store, stale_after_s=60) == []  # a second pass has nothing to do
    alive.end("FINISHED")
    legacy.end("FINISHED")
