"""`k25exp ui`: the MLflow UI on k25exp's store, with direct links to its runs tables."""

from __future__ import annotations

import sys


def main(args: list[str]) -> int:
    import argparse
    import os
    import subprocess

    p = argparse.ArgumentParser(prog="k25exp ui", description="Open the MLflow UI on k25exp's store.")
    p.add_argument("--port", type=int, default=5000, help="port to serve on (0: a free one)")
    p.add_argument("--host", default="127.0.0.1")
    # One viewer on a box that may be measuring: 1 worker answered the UI as well here and
    # took 2 processes, 7 s of CPU and 0.5 GiB instead of MLflow's 4 (7 processes, 16-20 s, 1.3 GiB)
    p.add_argument("--workers", type=int, default=1, help="MLflow UI worker processes (default 1)")
    p.add_argument("--uri", help="tracking store (default: $MLFLOW_TRACKING_URI, else outputs/mlflow.db)")
    p.add_argument("--links-only", action="store_true", help="print the links and exit (no server)")
    p.add_argument("--no-recover", action="store_true",
                   help="show the runs of jobs killed hard as MLflow left them (RUNNING) instead of "
                        "ending them KILLED first, as `k25exp recover` does")
    a = p.parse_args(args)
    from k25exp.config.store import store_uri
    from k25exp.serving.ports import free_port, taken
    from k25exp.tracking.ui_links import ui_links

    uri = a.uri or store_uri()
    if a.port < 0 or a.port > 65535:
        print(f"k25exp ui: --port {a.port}: expected 0 (a free one) to 65535", file=sys.stderr)
        return 2
    # `mlflow ui` exits 0 even when its server could not bind (MLflow 3.17 drops the server's
    # exit status): a taken port is found and named here, before anything starts (--links-only
    # may well point at a UI already serving there)
    port = a.port or free_port(a.host)
    if not a.links_only and (why := taken(a.host, port)):
        print(f"k25exp ui: port {port} on {a.host} is in use ({why}); pass --port with a free one "
              "(--port 0 picks one)", file=sys.stderr)
        return 2
    # A job killed hard left its run RUNNING, and a job never ends other jobs' runs: end them
    # here, before anyone reads the table, so a dead run shows KILLED with why (not RUNNING)
    if not a.no_recover:
        _recover(uri)
    # MLflow 3 opens experiments in its GenAI view; these links open the runs table instead, in
    # k25exp's saved views (brought up to date first: k25exp.tracking.ui_view)
    try:
        print("\n".join(ui_links(uri, f"http://{a.host}:{port}", write_views=True)), flush=True)
    except Exception as e:  # the links are a convenience: the UI still starts
        print(f"k25exp ui: no links ({type(e).__name__}: {e})", file=sys.stderr)
    if a.links_only:
        return 0
    argv = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri,
            "--host", a.host, "--port", str(port), "--workers", str(a.workers)]
    # Without MLflow's job runner (GenAI jobs; not needed to view runs): it starts 8 more
    # processes, 15 instead of 7, that took 17 s of CPU more by 5 s after start on a 2-core box
    # and stay in the background, on a machine that may be measuring. The user's setting wins.
    env = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", **os.environ}
    print("k25exp:", " ".join(argv), flush=True)
    server = subprocess.Popen(argv, env=env)
    try:
        rc = server.wait()
    except KeyboardInterrupt:  # Ctrl-C reached the server too: let it shut down cleanly
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
        return 130
    # Nobody stopped us, so the server ended on its own: a failure, whatever mlflow's status
    # (it is 0 even when the server could not start; its log above says why)
    print(f"k25exp ui: the MLflow UI stopped on its own (mlflow ui exit status {rc}); "
          "its log above says why", file=sys.stderr)
    return rc or 1


def _recover(uri: str) -> None:
    """`k25exp recover` on the store, its lines printed; a failure is said, never fatal (the
    UI still starts)."""
    from k25exp.config.schema import TrackingConfig
    from k25exp.tracking.recover import recover_stale

    try:
        from k25exp.tracking.mlflow_store import MlflowStore

        done = recover_stale(MlflowStore(uri), TrackingConfig.stale_after_s)
    except Exception as e:
        print(f"k25exp ui: looking for runs of dead jobs failed ({type(e).__name__}: {e})",
              file=sys.stderr)
        return
    for r in done:
        print(f"k25exp ui: run {r.run_id} of a dead job: {r.outcome} ({r.detail})", flush=True)
