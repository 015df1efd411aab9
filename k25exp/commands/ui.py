"""`k25exp ui`: the MLflow UI on k25exp's store, with direct links to its runs tables."""

from __future__ import annotations

import sys


def main(args: list[str]) -> int:
    import argparse
    import os
    import subprocess

    p = argparse.ArgumentParser(prog="k25exp ui", description="Open the MLflow UI on k25exp's store.")
    p.add_argument("--port", type=int, default=5000)
    p.add_argument("--host", default="127.0.0.1")
    # One viewer on a box that may be measuring: 1 worker answered the UI as well here and
    # took 2 processes, 7 s of CPU and 0.5 GiB instead of MLflow's 4 (7 processes, 16-20 s, 1.3 GiB)
    p.add_argument("--workers", type=int, default=1, help="MLflow UI worker processes (default 1)")
    p.add_argument("--uri", help="tracking store (default: $MLFLOW_TRACKING_URI, else outputs/mlflow.db)")
    p.add_argument("--links-only", action="store_true", help="print the links and exit (no server)")
    a = p.parse_args(args)
    from k25exp.compare.links import ui_links
    from k25exp.config.store import store_uri

    uri = a.uri or store_uri()
    # MLflow 3 opens experiments in its GenAI view; these links open the runs table instead, in
    # k25exp's saved views (brought up to date first: k25exp.tracking.ui_view)
    try:
        print("\n".join(ui_links(uri, f"http://{a.host}:{a.port}", write_views=True)), flush=True)
    except Exception as e:  # the links are a convenience: the UI still starts
        print(f"k25exp ui: no links ({type(e).__name__}: {e})", file=sys.stderr)
    if a.links_only:
        return 0
    argv = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri,
            "--host", a.host, "--port", str(a.port), "--workers", str(a.workers)]
    # Without MLflow's job runner (GenAI jobs; not needed to view runs): it starts 8 more
    # processes, 15 instead of 7, that took 17 s of CPU more by 5 s after start on a 2-core box
    # and stay in the background, on a machine that may be measuring. The user's setting wins.
    env = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", **os.environ}
    print("k25exp:", " ".join(argv), flush=True)
    return subprocess.call(argv, env=env)
