"""Checks a local SQLite MLflow store before MLflow touches it.

MLflow migrates a store it opens: an empty file gets the whole schema, a store missing some
tables gets `create_all` and every migration again. On a store another process is creating,
or one a crash left half-migrated, that makes things worse ("duplicate column name: step",
"table _alembic_tmp_params already exists"); on a store written by a newer MLflow it fails
with advice to *upgrade*. So k25exp reads the schema first (read-only, under the store lock)
and lets MLflow open only a fresh file or a store at exactly this MLflow's schema revision;
anything else is refused with what to do, and never written to. The one exception is a
journal that a writer killed mid-transaction left: SQLite's rollback of it (what any read-write
open does) is let happen, since a read-only open refuses it and the store would stay refused.
"""

from __future__ import annotations

import functools
import sqlite3
from pathlib import Path


class StoreRefused(RuntimeError):
    """The store can't be used as it is; the message says why and what to do."""


@functools.lru_cache(maxsize=1)
def _revisions() -> tuple[str, frozenset]:
    """(head, every revision) of this MLflow's migration scripts."""
    from alembic.script import ScriptDirectory
    from mlflow.store.db.utils import _get_alembic_config

    script = ScriptDirectory.from_config(_get_alembic_config(db_url=""))
    heads = script.get_heads()
    return heads[0], frozenset(r.revision for r in script.walk_revisions())


@functools.lru_cache(maxsize=1)
def _expected_tables() -> frozenset:
    from mlflow.store.db.base_sql_model import Base
    import mlflow.store.tracking.dbmodels.models  # noqa: F401  (registers the tables)

    return frozenset(Base.metadata.tables)


def _read_schema(db: Path, mode: str) -> tuple[set, list]:
    con = sqlite3.connect(f"file:{db}?mode={mode}", uri=True)
    try:
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        rev = (con.execute("SELECT version_num FROM alembic_version").fetchall()
               if "alembic_version" in tables else [])
    finally:
        con.close()
    return tables, rev


def _hot_journal(e: sqlite3.OperationalError, db: Path) -> bool:
    """The read-only open refused to roll back a journal an interrupted writer left."""
    name = getattr(e, "sqlite_errorname", "")  # Python >= 3.11
    if name:
        return name == "SQLITE_READONLY_ROLLBACK"
    journal = db.with_name(db.name + "-journal")
    return "readonly" in str(e) and journal.exists() and journal.stat().st_size > 0


def check_store(db: Path) -> str:
    """'fresh' (MLflow may create the schema) or 'current'; raises StoreRefused otherwise."""
    if not db.exists() or db.stat().st_size == 0:
        return "fresh"
    import mlflow

    uri = f"sqlite:///{db}"
    try:
        try:
            tables, rev = _read_schema(db, "ro")
        except sqlite3.OperationalError as e:
            if not _hot_journal(e, db):
                raise
            # A writer killed mid-transaction (SIGKILL, power loss) left a hot journal: SQLite
            # rolls it back on the next read-write open, which a read-only one may not do. That
            # rollback is SQLite's own recovery, the same MLflow's next open would run.
            tables, rev = _read_schema(db, "rw")
    except sqlite3.DatabaseError as e:
        raise StoreRefused(f"tracking.uri={uri}: not a readable SQLite database ({e}); point "
                           "tracking.uri at another file, or restore this one from a backup") from None
    if not tables:
        return "fresh"
    half = ("it is half-migrated, as a fresh store created by several processes at once is "
            "left; k25exp will not modify it further. Move it aside and let the next job create "
            "a new one (or restore a backup); runs logged to it are still readable with sqlite3")
    leftovers = sorted(t for t in tables if t.startswith("_alembic_tmp"))
    if leftovers:
        raise StoreRefused(f"tracking.uri={uri}: leftover migration tables {leftovers}: {half}")
    if len(rev) != 1:
        raise StoreRefused(f"tracking.uri={uri}: {len(tables)} tables but no schema revision "
                           f"(alembic_version): {half}")
    rev = rev[0][0]
    head, known = _revisions()
    if rev == head:
        missing = sorted(_expected_tables() - tables)
        if missing:
            raise StoreRefused(f"tracking.uri={uri}: at revision {rev} but tables {missing} are "
                               f"missing: {half}")
        return "current"
    if rev not in known:
        raise StoreRefused(
            f"tracking.uri={uri}: schema revision {rev} was written by a newer MLflow than this "
            f"one ({mlflow.__version__}, head {head}); k25exp will not modify it. Run k25exp with "
            "that MLflow version (pip install -U mlflow), or point tracking.uri at another store")
    raise StoreRefused(
        f"tracking.uri={uri}: schema revision {rev} is older than this MLflow's "
        f"({mlflow.__version__}, head {head}). Back the file up, then upgrade it once with "
        f"`mlflow db upgrade {uri}` (no job running)")
