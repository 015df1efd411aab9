"""`k25exp sync PATH...`: upload offline run folders (tracking=offline) to an MLflow store, once."""

from __future__ import annotations

import sys


def main(args: list[str]) -> int:
    import argparse
    from pathlib import Path

    p = argparse.ArgumentParser(prog="k25exp sync",
                                description="Upload offline run folders to an MLflow store, once.")
    p.add_argument("paths", nargs="+", type=Path, help="run or sweep folders (searched recursively)")
    p.add_argument("--uri", help="target store (default: $MLFLOW_TRACKING_URI, else outputs/mlflow.db)")
    p.add_argument("--artifact-root", help="artifact folder for a local store (default: beside it)")
    a = p.parse_args(args)
    from k25exp.config.store import sqlite_path, store_uri
    from k25exp.tracking.mlflow_store import MlflowStore
    from k25exp.tracking.offline import sync

    uri = a.uri or store_uri()
    db = sqlite_path(uri)
    root = a.artifact_root or (str(db.parent / "mlartifacts") if db else None)
    missing = [str(x) for x in a.paths if not x.exists()]
    if missing:
        print(f"k25exp sync: no such folder: {', '.join(missing)}", file=sys.stderr)
        return 2
    from k25exp.config.schema import TrackingConfig
    from k25exp.tracking.runs import recover_dead_runs

    store = MlflowStore(uri, root)
    # a user's command on the store, like `k25exp ui`: dead jobs' runs are ended first (jobs
    # themselves never look: k25exp.tracking.runs.recover_dead_runs)
    recover_dead_runs(store, TrackingConfig())
    report = sync(a.paths, store)
    for folder, run_id, what in report:
        print(f"{what:>16}  {run_id or '-':32}  {folder}")
    print(f"k25exp sync: {sum(w == 'uploaded' for _, _, w in report)} uploaded, "
          f"{sum(w == 'already synced' for _, _, w in report)} already there, to {uri}")
    return 1 if any(w.startswith("skipped") for _, _, w in report) else 0
