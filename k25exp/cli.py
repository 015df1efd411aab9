"""The `k25exp` command: Hydra jobs by default, a few helper subcommands by name.

    k25exp experiment=nccl_burst [key=value ...]     # same as python -m k25exp ...
    k25exp -m experiment=nccl_burst experiment.tokens=1,8,64
    k25exp ui [--port 5000]                          # MLflow UI on the default store
"""

from __future__ import annotations

import sys


def _ui(args: list[str]) -> int:
    import argparse
    import os
    import subprocess

    p = argparse.ArgumentParser(prog="k25exp ui", description="Open the MLflow UI on k25exp's store.")
    p.add_argument("--port", type=int, default=5000)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--uri", help="tracking store (default: $MLFLOW_TRACKING_URI, else outputs/mlflow.db)")
    a = p.parse_args(args)
    from k25exp.config.store import project_root

    uri = a.uri or os.environ.get("MLFLOW_TRACKING_URI") or \
        f"sqlite:///{project_root() / 'outputs' / 'mlflow.db'}"
    argv = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri,
            "--host", a.host, "--port", str(a.port)]
    print("k25exp:", " ".join(argv), flush=True)
    return subprocess.call(argv)


SUBCOMMANDS = {"ui": _ui}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] in SUBCOMMANDS:
        sys.exit(SUBCOMMANDS[sys.argv[1]](sys.argv[2:]))
    from k25exp import job
    from k25exp.app import hydra_main

    hydra_main()
    if job.failed_jobs:
        print(f"k25exp: {job.failed_jobs} job(s) failed", file=sys.stderr)
        sys.exit(1)
