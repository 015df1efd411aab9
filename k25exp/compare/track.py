"""The compare as an MLflow run of its own (experiment `k25exp/compare`): both sides linked by
tag, the verdict counts as metrics, the tables as artifacts."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from k25exp.compare.table import Comparison
from k25exp.config.store import sqlite_path

EXPERIMENT = "k25exp/compare"
DESCRIPTION = ("k25exp compare A B: two runs, sweeps or campaigns figure by figure, with "
               "Mann-Whitney U and a bootstrap interval of the median's change from the raw "
               "samples; each run's tags compare.a_runs / compare.b_runs name both sides.")


def artifact_root(uri: str) -> Optional[str]:
    """Where a local SQLite store keeps artifacts: beside the database, as k25exp's runs do."""
    db = sqlite_path(uri)
    return str(db.parent / "mlartifacts") if db else None


def log(uri: str, c: Comparison, folder: Path, name: str) -> str:
    """Logs the compare; returns its run id."""
    from k25exp.tracking.mlflow_store import MlflowStore

    store = MlflowStore(uri, artifact_root(uri))
    tags = {
        "compare.a": c.a.ident, "compare.b": c.b.ident,
        "compare.a_kind": c.a.kind, "compare.b_kind": c.b.kind,
        "compare.a_runs": " ".join(r.run_id for r in c.a.runs),
        "compare.b_runs": " ".join(r.run_id for r in c.b.runs),
        "compare.pairs": " ".join(f"{p.a.run_id}:{p.b.run_id}" for p in c.pairs),
        "compare.fail_on": "off" if c.fail_on is None else f"{c.fail_on:g}",
        "compare.verdict": "fail" if c.failing else "ok",
        # whether A and B sent the same requests (k25exp.compare.shapes)
        "compare.requests": "; ".join(c.shape_diff)[:5000] if c.shape_diff else "same shape",
        "k25exp.experiment": "compare",
        "mlflow.note.content": f"compare of {c.a.kind} {c.a.ident} (A) with {c.b.kind} {c.b.ident} (B)",
    }
    run = store.start_run(EXPERIMENT, run_name=f"compare {name}"[:250], tags=tags)
    store.client.set_experiment_tag(store.experiment_id(EXPERIMENT), "mlflow.note.content", DESCRIPTION)
    status = "FAILED"
    try:
        run.log_params({"alpha": c.alpha, "noise_pct": c.noise, "fail_on": c.fail_on,
                        "a": c.a.ident, "b": c.b.ident})
        run.log_metrics({"pairs": len(c.pairs), "figures": len(c.rows),
                         "figures_tested": sum(r.test is not None for r in c.rows),
                         "significant_changes": len(c.significant),
                         "worse_beyond_fail_on": len(c.failing),
                         "env_tags_differing": len(c.tag_diff), "unmatched": len(c.unmatched)})
        run.log_artifacts(folder)
        status = "FINISHED"
    finally:
        run.end(status)
    return run.run_id
