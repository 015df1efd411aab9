"""`k25exp compare A B`: the argument handling, output folder and exit status.

Exit status: 0 when the compare ran (and, with --fail-on, nothing failed it), 1 when a
significant change in the worse direction exceeds --fail-on, 2 when A and B cannot be
compared (an unknown id, runs of different experiments, an unreadable store).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

from k25exp.config.store import sqlite_path, store_uri


def folder_name(a: str, b: str) -> str:
    return re.sub(r"[^\w.-]", "_", f"{a[:12]}_vs_{b[:12]}")


def to_json(c) -> dict:
    return {"a": {"id": c.a.ident, "kind": c.a.kind, "runs": [r.run_id for r in c.a.runs]},
            "b": {"id": c.b.ident, "kind": c.b.kind, "runs": [r.run_id for r in c.b.runs]},
            "alpha": c.alpha, "noise_pct": c.noise, "fail_on": c.fail_on, "failing": len(c.failing),
            "rows": [{"pair": r.pair, "metric": r.metric, "step": r.step, "a": r.a, "b": r.b,
                      "change_pct": r.change_pct, "better": r.better, "significant": r.significant, "within_noise": r.within_noise,
                      "p_adjusted": r.p_adjusted, "p": r.test.p if r.test else None,
                      "median_change_pct": r.test.median_change_pct if r.test else None,
                      "ci_pct": [r.test.ci_low_pct, r.test.ci_high_pct] if r.test else None,
                      "n": [r.test.n_a, r.test.n_b] if r.test else None,
                      "worse_beyond_fail_on": r.worse_beyond, "note": r.note} for r in c.rows],
            "tag_diff": c.tag_diff, "param_diff": c.param_diff, "unmatched": c.unmatched,
            "notes": c.notes, "shape_diff": c.shape_diff}


def main(args: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="k25exp compare",
        description="Compare two runs, sweeps (parent run ids) or campaigns (campaign ids): every "
                    "figure with its change and whether the raw samples say it is significant.")
    p.add_argument("a", help="run id, sweep parent run id or campaign id (the reference)")
    p.add_argument("b", help="the same kind of id (the candidate)")
    p.add_argument("--uri", help="tracking store (default: $MLFLOW_TRACKING_URI, else outputs/mlflow.db)")
    p.add_argument("--fail-on", type=float, metavar="PCT",
                   help="exit 1 when a significant change in the worse direction exceeds PCT percent")
    p.add_argument("--alpha", type=float, default=0.05, help="significance level (default 0.05)")
    p.add_argument("--noise", type=float, default=None, metavar="PCT",
                   help="noise floor: a median change smaller than PCT percent is never called "
                        "significant (default 5: run-to-run drift of a shared machine)")
    p.add_argument("--out", type=Path, help="output folder (default outputs/compare/<A>_vs_<B>)")
    p.add_argument("--name", help="folder and run name (default <A>_vs_<B>)")
    p.add_argument("--ui-url", default="http://127.0.0.1:5000",
                   help="where `k25exp ui` serves the store; the pages link each run there")
    p.add_argument("--no-track", action="store_true", help="do not log the compare as an MLflow run")
    a = p.parse_args(args)
    if a.fail_on is not None and a.fail_on < 0:
        p.error(f"--fail-on must be a percentage >= 0, got {a.fail_on:g}")
    if a.noise is not None and a.noise < 0:
        p.error(f"--noise must be a percentage >= 0, got {a.noise:g}")
    if not 0 < a.alpha < 1:
        p.error(f"--alpha must be between 0 and 1, got {a.alpha:g}")

    from k25exp.compare import render, track
    from k25exp.compare.resolve import CompareError
    from k25exp.compare.table import DEFAULT_NOISE_PCT, compare
    from k25exp.config.store import project_root

    uri = a.uri or store_uri()
    db = sqlite_path(uri)
    if db and not db.exists():
        # MLflow would create an empty store there and then find nothing
        print(f"k25exp compare: no MLflow store at {uri} (--uri or $MLFLOW_TRACKING_URI)", file=sys.stderr)
        return 2
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # one bar per artifact
    try:
        c = compare(uri, a.a, a.b, a.alpha, a.fail_on,
                    DEFAULT_NOISE_PCT if a.noise is None else a.noise)
    except CompareError as e:
        print(f"k25exp compare: {e}", file=sys.stderr)
        return 2
    c.ui_url = a.ui_url
    name = a.name or folder_name(a.a, a.b)
    folder = a.out or project_root() / "outputs" / "compare" / name
    generated = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    render.print_terminal(c)
    md, page = render.write(folder, c, generated)
    (folder / "compare.json").write_text(json.dumps(to_json(c), indent=1))
    print(f"compare: {page}\ncompare (markdown): {md}")
    if not a.no_track:
        run_id = track.log(uri, c, folder, name)
        print(f"compare run: {run_id} (experiment {track.EXPERIMENT})")
    return 1 if c.failing else 0
