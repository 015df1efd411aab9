"""The `k25exp` command: Hydra jobs by default, a few helper subcommands by name.

    k25exp experiment=nccl_burst [key=value ...]     # same as python -m k25exp ...
    k25exp -m experiment=nccl_burst experiment.tokens=1,8,64
    k25exp ui [--port 5000] [--workers 1] [--links-only]  # MLflow UI on the default store, direct links
    k25exp sync PATH... [--uri URI]                  # upload offline runs (tracking=offline)
    k25exp recover [--uri URI] [--dry-run]           # end runs of jobs killed hard, KILLED
    k25exp analyze TRACE... [--json] [--out DIR]     # decode-step breakdown of profiler traces
    k25exp make-model [model=tiny_kimi] [seed=0]     # the embedded model (macro's default)
    k25exp make-model model=kimi_k25_int4 model.tp_rank_of=8   # one TP-8 rank, config only
    k25exp compare A B [--fail-on PCT]               # two runs / sweeps / campaigns, with significance
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
    # One viewer on a box that may be measuring: 1 worker answered the UI as well here and
    # took 2 processes, 7 s of CPU and 0.5 GiB instead of MLflow's 4 (7 processes, 16-20 s, 1.3 GiB)
    p.add_argument("--workers", type=int, default=1, help="MLflow UI worker processes (default 1)")
    p.add_argument("--uri", help="tracking store (default: $MLFLOW_TRACKING_URI, else outputs/mlflow.db)")
    p.add_argument("--links-only", action="store_true", help="print the links and exit (no server)")
    a = p.parse_args(args)
    from k25exp.compare.links import ui_links
    from k25exp.config.store import project_root

    uri = a.uri or os.environ.get("MLFLOW_TRACKING_URI") or \
        f"sqlite:///{project_root() / 'outputs' / 'mlflow.db'}"
    # MLflow 3 opens experiments in its GenAI view; these links open the runs table instead
    try:
        print("\n".join(ui_links(uri, f"http://{a.host}:{a.port}")), flush=True)
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


def _make_model(args: list[str]) -> int:
    from k25exp.serving.tiny_model import cli

    return cli(args)


def _sync(args: list[str]) -> int:
    import argparse
    import os
    from pathlib import Path

    p = argparse.ArgumentParser(prog="k25exp sync",
                                description="Upload offline run folders to an MLflow store, once.")
    p.add_argument("paths", nargs="+", type=Path, help="run or sweep folders (searched recursively)")
    p.add_argument("--uri", help="target store (default: $MLFLOW_TRACKING_URI, else outputs/mlflow.db)")
    p.add_argument("--artifact-root", help="artifact folder for a local store (default: beside it)")
    a = p.parse_args(args)
    from k25exp.config.store import project_root
    from k25exp.tracking.mlflow_store import MlflowStore
    from k25exp.tracking.offline import sync

    outputs = project_root() / "outputs"
    uri = a.uri or os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{outputs / 'mlflow.db'}"
    root = a.artifact_root or (str(Path(uri[len("sqlite:///"):]).parent / "mlartifacts")
                               if uri.startswith("sqlite:///") else None)
    missing = [str(x) for x in a.paths if not x.exists()]
    if missing:
        print(f"k25exp sync: no such folder: {', '.join(missing)}", file=sys.stderr)
        return 2
    from k25exp.config.schema import TrackingConfig
    from k25exp.tracking.runs import recover_dead_runs

    store = MlflowStore(uri, root)
    recover_dead_runs(store, TrackingConfig())  # as every command that opens the store
    report = sync(a.paths, store)
    for folder, run_id, what in report:
        print(f"{what:>16}  {run_id or '-':32}  {folder}")
    print(f"k25exp sync: {sum(w == 'uploaded' for _, _, w in report)} uploaded, "
          f"{sum(w == 'already synced' for _, _, w in report)} already there, to {uri}")
    return 1 if any(w.startswith("skipped") for _, _, w in report) else 0


def _recover(args: list[str]) -> int:
    import argparse
    import os

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
    from k25exp.config.store import project_root
    from k25exp.tracking.mlflow_store import MlflowStore
    from k25exp.tracking.recover import recover_stale
    from k25exp.tracking.sqlite_schema import StoreRefused

    uri = a.uri or os.environ.get("MLFLOW_TRACKING_URI") or \
        f"sqlite:///{project_root() / 'outputs' / 'mlflow.db'}"
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


def _analyze(args: list[str]) -> int:
    import argparse
    import json
    from pathlib import Path

    p = argparse.ArgumentParser(prog="k25exp analyze",
                                description="Where each decode step's time goes, from torch.profiler "
                                            "traces (one per rank, .json or .json.gz).")
    p.add_argument("traces", nargs="+", type=Path, help="trace files, or folders to search")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.add_argument("--rules", type=Path, help="classification rules YAML (default: conf/trace_rules/default.yaml)")
    p.add_argument("--max-steps", type=int, help="analyse only the first N decode steps per rank")
    p.add_argument("--out", type=Path, help="also write tables, plots and JSON into this folder")
    p.add_argument("--top", type=int, default=30, help="rows of the top-kernels table")
    a = p.parse_args(args)
    from k25exp.runners.trace_breakdown import expand
    from k25exp.traces import RulesError, TraceError, analyze, summary_text, write_outputs

    try:
        paths = expand([str(x) for x in a.traces], "*.pt.trace.json*")
        if not paths:
            raise FileNotFoundError(f"no trace found in {', '.join(map(str, a.traces))}")
        analysis = analyze(paths, rules_path=a.rules, max_steps=a.max_steps)
    except (TraceError, RulesError, FileNotFoundError) as e:
        print(f"k25exp analyze: {e}", file=sys.stderr)
        return 2
    if a.out:
        write_outputs(analysis, a.out, top=a.top)
    if a.json:
        print(json.dumps(analysis.to_dict(top=a.top), indent=1))
    else:
        print(summary_text(analysis))  # warnings included
    return 0


def _compare(args: list[str]) -> int:
    from k25exp.compare.command import main as compare_main

    return compare_main(args)


SUBCOMMANDS = {"ui": _ui, "sync": _sync, "recover": _recover, "analyze": _analyze,
               "make-model": _make_model, "compare": _compare}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] in SUBCOMMANDS:
        sys.exit(SUBCOMMANDS[sys.argv[1]](sys.argv[2:]))
    from k25exp import job
    from k25exp.app import hydra_main

    from k25exp.tracking import hydra_callback

    hydra_main()
    # Jobs may have run in other processes (parallel launchers): the sweep's own tally wins.
    failed = max(job.failed_jobs, hydra_callback.last_sweep_failed or 0)
    if failed:
        print(f"k25exp: {failed} job(s) failed", file=sys.stderr)
        sys.exit(1)
