"""A local SQLite store is created under the store lock, and a store this MLflow did not
write (or a half-migrated one) is refused with what to do, byte for byte untouched."""

from __future__ import annotations

import hashlib
import shutil
import sqlite3
import threading

import pytest

from k25exp.tracking.mlflow_store import MlflowStore, store_lock
from k25exp.tracking.sqlite_schema import StoreRefused, check_store
from tests.conftest import pristine_store


def _digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def pristine():
    """One store MLflow created (a fresh schema takes seconds); each test damages a copy."""
    return pristine_store()


@pytest.fixture
def store_db(pristine, tmp_path):
    db = tmp_path / "mlflow.db"
    shutil.copy(pristine, db)
    assert check_store(db) == "current"
    return db


def _sql(db, *stmts):
    con = sqlite3.connect(db)
    for s in stmts:
        con.execute(s)
    con.commit()
    con.close()


def test_a_newer_schema_is_refused_and_left_as_it_is(store_db):
    _sql(store_db, "UPDATE alembic_version SET version_num = 'f00dfeedbeef'")
    before = _digest(store_db)
    with pytest.raises(StoreRefused, match="newer MLflow.*will not modify it"):
        MlflowStore(f"sqlite:///{store_db}")
    assert _digest(store_db) == before


def test_an_older_schema_is_refused_with_the_upgrade_command(store_db):
    from k25exp.tracking.sqlite_schema import _revisions

    head, known = _revisions()
    older = next(r for r in known if r != head)
    _sql(store_db, f"UPDATE alembic_version SET version_num = '{older}'")
    before = _digest(store_db)
    with pytest.raises(StoreRefused, match="mlflow db upgrade sqlite:///"):
        MlflowStore(f"sqlite:///{store_db}")
    assert _digest(store_db) == before


@pytest.mark.parametrize("damage", [
    "CREATE TABLE _alembic_tmp_params (key VARCHAR(250))",  # a migration cut short
    "DROP TABLE alembic_version",  # tables created, revision never written
    "DROP TABLE params",  # at head, but a table missing
])
def test_a_half_migrated_store_is_refused_and_left_as_it_is(store_db, damage):
    _sql(store_db, damage)
    before = _digest(store_db)
    with pytest.raises(StoreRefused, match="half-migrated"):
        MlflowStore(f"sqlite:///{store_db}")
    assert _digest(store_db) == before


def test_a_file_that_is_not_sqlite_is_refused(tmp_path):
    db = tmp_path / "mlflow.db"
    db.write_text("not a database, just text long enough to be read as a header " * 20)
    with pytest.raises(StoreRefused, match="not a readable SQLite database"):
        MlflowStore(f"sqlite:///{db}")


def test_store_creation_waits_for_the_store_lock(tmp_path):
    """Whoever holds the lock (another job's call) keeps a fresh store from being created."""
    db = tmp_path / "mlflow.db"
    lock = store_lock(db.with_name(db.name + ".lock"))
    created = threading.Event()

    def create():
        MlflowStore(f"sqlite:///{db}")
        created.set()

    with lock:
        t = threading.Thread(target=create)
        t.start()
        assert not created.wait(1.0), "the store was created while the lock was held"
        assert not db.exists() or db.stat().st_size == 0
    assert created.wait(60)
    t.join()
    assert check_store(db) == "current"


def test_the_lock_is_reentrant_within_a_process(store_db):
    store = MlflowStore(f"sqlite:///{store_db}")
    with store.lock:  # recovery holds it across calls that take it again
        run = store.start_run("k25exp/test")
        run.log_metrics({"a": 1.0})
        run.end("FINISHED")
    assert store.client.get_run(run.run_id).info.status == "FINISHED"


def test_a_store_left_by_a_writer_killed_mid_transaction_is_rolled_back_and_used(store_db):
    """SIGKILL during a write leaves a hot journal; a read-only probe can't roll it back
    (SQLITE_READONLY_ROLLBACK), so the store must not be refused for it."""
    import subprocess
    import sys

    _sql(store_db, "INSERT INTO experiments (name, lifecycle_stage) VALUES ('kept', 'active')")
    # A transaction big enough to spill past a 5-page cache writes the db file itself, then the
    # writer dies without committing or rolling back: what `kill -9` on a job leaves.
    writer = ("import os, sqlite3, sys; c = sqlite3.connect(sys.argv[1]); "
              "c.execute('PRAGMA cache_size=5'); c.execute('BEGIN'); "
              "c.execute('CREATE TABLE filler (x)'); "
              "c.executemany('INSERT INTO filler VALUES (?)', [('x' * 500,)] * 4000); "
              "c.execute(\"UPDATE experiments SET name = 'lost' WHERE name = 'kept'\"); "
              "os._exit(0)")
    subprocess.run([sys.executable, "-c", writer, str(store_db)], check=True)
    journal = store_db.with_name(store_db.name + "-journal")
    assert journal.stat().st_size > 0
    with pytest.raises(sqlite3.OperationalError, match="readonly"):  # what check_store meets
        sqlite3.connect(f"file:{store_db}?mode=ro", uri=True).execute(
            "SELECT name FROM sqlite_master").fetchall()

    assert check_store(store_db) == "current"
    assert not journal.exists() or journal.stat().st_size == 0
    con = sqlite3.connect(store_db)
    names = {r[0] for r in con.execute("SELECT name FROM experiments")}
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    con.close()
    assert "kept" in names and "lost" not in names and "filler" not in tables
    store = MlflowStore(f"sqlite:///{store_db}")
    assert store.client.get_experiment_by_name("kept") is not None
