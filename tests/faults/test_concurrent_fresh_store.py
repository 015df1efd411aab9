"""Four jobs started at once on a store that does not exist yet all finish with their runs.

Before the store's creation went under the store lock, MLflow created and migrated the
schema in each process at once ("duplicate column name: step", "table _alembic_tmp_params
already exists") and left the store half-migrated.
"""

from __future__ import annotations

import time

import pytest
from mlflow.tracking import MlflowClient

from k25exp.tracking.sqlite_schema import check_store
from tests.conftest import LIGHT_JOB, LIGHT_METRIC
from tests.faults.helpers import start_job

pytestmark = pytest.mark.e2e  # starts processes end to end (pyproject's markers)

JOBS = 4


def test_four_jobs_at_once_on_a_fresh_store(tmp_path):
    outputs = tmp_path / "outputs"
    uri = f"sqlite:///{outputs}/mlflow.db"
    t0 = time.perf_counter()
    # The race is at the store's creation, as each job starts: the lightest job will do, and
    # forked from the warm interpreter the four reach the store within ~0.3 s of each other.
    procs = [start_job(outputs, tmp_path / f"job{i}", *LIGHT_JOB, warm=True) for i in range(JOBS)]
    logs = [p.communicate(timeout=240)[0] for p in procs]
    wall = time.perf_counter() - t0
    print(f"{JOBS} jobs at once on a fresh store: {wall:.1f} s")
    for p, log in zip(procs, logs):
        assert p.returncode == 0, log[-4000:]
    assert check_store(outputs / "mlflow.db") == "current"
    c = MlflowClient(uri)
    runs = c.search_runs([e.experiment_id for e in c.search_experiments()])
    assert len(runs) == JOBS
    assert {r.info.status for r in runs} == {"FINISHED"}
    for r in runs:
        assert sorted(m.step for m in c.get_metric_history(r.info.run_id, LIGHT_METRIC)) == [1, 2]
        assert r.data.tags["k25exp.pid"] and r.data.tags["k25exp.host"]
