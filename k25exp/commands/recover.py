"""`k25exp recover`: end the RUNNING runs of jobs killed hard, with what their folders hold."""

from __future__ import annotations

import sys


def main(args: list[str]) -> int:
    import argparse

    from k25exp.config.schema import TrackingConfig

    p = argparse.ArgumentParser(prog="k25exp recover",
                                description="End the RUNNING runs whose job was killed hard (SIGKILL, "
                                            "OOM, lost node): upload the run folder, recompute what "
                                            "figures it allows, and mark the run KILLED.")
    p.add_argument("--uri", help="store (default: $MLFLOW_TRACKING_URI, else outputs/mlflow.db)")
    p.add_argument("--stale-after-s", type=float, default=TrackingConfig.stale_after_s,
                   help="a run on another host is dead when its heartbeat is older than this "
                        "(default %(default)s)")
    p.add_argument("--dry-run", action="store_true", help="only list the runs that would be recovered")
    a = p.parse_args(args)
    from k25exp.config.store import store_uri
    from k25exp.tracking.mlflow_store import MlflowStore
    from k25exp.tracking.recover import recover_stale
    from k25exp.tracking.sqlite_schema import StoreRefused

    uri = a.uri or store_uri()
    try:
        store = MlflowStore(uri)
    except StoreRefused as e:
        print(f"k25exp recover: {e}", file=sys.stderr)
        return 2
    report = recover_stale(store, a.stale_after_s, dry_run=a.dry_run)
    for r in report:
        print(f"{r.outcome:>13}  {r.run_id}  {r.detail}")
    print(f"k25exp recover: {sum(r.outcome == 'recovered' for r in report)} recovered, "
          f"{sum(r.outcome == 'stale' for r in report)} to recover (dry run), "
          f"{sum(r.outcome == 'failed' for r in report)} failed, in {uri}")
    return 1 if any(r.outcome == "failed" for r in report) else 0
