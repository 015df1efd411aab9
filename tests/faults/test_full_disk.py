"""A store that can't grow (a full disk) gives a clear error and leaves the run folder intact.

No small filesystem can be mounted here without root, so the full disk is simulated with a
file-size limit (RLIMIT_FSIZE) on the job's process: writes past the limit fail with EFBIG
(Python ignores SIGXFSZ), as writes to a full disk fail with ENOSPC. The limit lets the store grow
by a few pages (room for the run, not for its params) and is far above the size of every
file of the run folder, so the store fills and the run folder does not. The store is vacuumed
first, so it has no free pages to grow into.
"""

from __future__ import annotations

import resource
import sqlite3

import pytest

from k25exp.tracking.mlflow_store import MlflowStore
from tests.faults.helpers import artifact_paths, only_run, recover, start_job

pytestmark = pytest.mark.e2e  # starts processes end to end (pyproject's markers)

# Room for the run's row and tags (a few pages), not for its ~300 params.
GROWTH = 16 * 1024


def _limit_file_size(limit: int):
    def apply():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def test_full_disk_store_gives_a_clear_error_and_keeps_the_folder(tmp_path):
    outputs, run_dir = tmp_path / "outputs", tmp_path / "run"
    db = outputs / "mlflow.db"
    # Created, with the job's experiment, before the disk "fills".
    MlflowStore(f"sqlite:///{db}", str(outputs / "mlartifacts")).experiment_id("k25exp/all_to_all")
    con = sqlite3.connect(db)
    con.execute("VACUUM")  # no free pages left: any growth of the store must extend the file
    con.close()
    limit = db.stat().st_size + GROWTH
    assert limit > 512 * 1024  # far above any file of the run folder
    job = start_job(outputs, run_dir, "experiment=all_to_all", "debug=quick",
                    "experiment.tokens_per_gpu=[1]", "experiment.communicator=torch", preexec_fn=_limit_file_size(limit))
    log = job.communicate(timeout=180)[0]
    assert job.returncode != 0, log[-3000:]
    assert "could not be written" in log and "disk is full" in log, log[-3000:]
    assert str(db) in log
    print(next(line for line in log.splitlines() if "could not be written" in line))
    assert (run_dir / ".hydra" / "config.yaml").stat().st_size > 0
    con = sqlite3.connect(db)  # the store itself is not damaged
    assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    con.close()

    # Space again. Ending the run rewrites one row in place, which a full disk may still
    # allow: then the job marked its run FAILED itself, and recovery leaves it alone.
    c, run = only_run(f"sqlite:///{db}")
    assert run.info.status in ("RUNNING", "FAILED")
    if run.info.status == "FAILED":
        r = recover(f"sqlite:///{db}")
        assert r.returncode == 0 and "1 recovered" not in r.stdout, r.stdout + r.stderr
        assert c.get_run(run.info.run_id).info.status == "FAILED"
        return
    # ... else the run the job had opened is still RUNNING; recovery uploads its folder.
    r = recover(f"sqlite:///{db}")
    assert r.returncode == 0 and "1 recovered" in r.stdout, r.stdout + r.stderr
    run = c.get_run(run.info.run_id)
    assert run.info.status == "KILLED"
    assert {"config.resolved.yaml", ".hydra/config.yaml"} <= artifact_paths(c, run.info.run_id)
