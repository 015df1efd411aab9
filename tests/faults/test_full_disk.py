"""A store that can't grow (a full disk) gives a clear error and leaves the run folder intact.

No small filesystem can be mounted here without root, so the full disk is simulated with a
file-size limit (RLIMIT_FSIZE) on the job's process: writes past the limit fail with EFBIG
(Python ignores SIGXFSZ), as writes to a full disk fail with ENOSPC. The limit sits below the
store's size and above the size of every file of the run folder, so the store can't grow
and the run folder can. The store is vacuumed first, so it has no free pages to
grow into.
"""

from __future__ import annotations

import resource
import sqlite3

from k25exp.tracking.mlflow_store import MlflowStore
from tests.faults.helpers import start_job

LIMIT = 256 * 1024


def _limit_file_size():
    resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT, LIMIT))


def test_full_disk_store_gives_a_clear_error_and_keeps_the_folder(tmp_path):
    outputs, run_dir = tmp_path / "outputs", tmp_path / "run"
    db = outputs / "mlflow.db"
    MlflowStore(f"sqlite:///{db}")  # created before the disk "fills"
    con = sqlite3.connect(db)
    con.execute("VACUUM")  # no free pages left: any growth of the store must extend the file
    con.close()
    assert db.stat().st_size > LIMIT
    job = start_job(outputs, run_dir, "experiment=all_to_all", "debug=quick",
                    "experiment.tokens_per_gpu=[1]", preexec_fn=_limit_file_size)
    log = job.communicate(timeout=180)[0]
    assert job.returncode != 0, log[-3000:]
    assert "could not be written" in log and "disk is full" in log, log[-3000:]
    assert str(db) in log
    assert (run_dir / ".hydra" / "config.yaml").stat().st_size > 0
    con = sqlite3.connect(db)  # the store itself is not damaged
    assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    con.close()
