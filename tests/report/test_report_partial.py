"""A campaign with a failed phase and missing ones: the report names them and reports the
rest. No vLLM server starts (the macro phase fails on its model path), so this runs beside the
servers worker."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_campaign, warm_python
from tests.report.test_report_campaign import latest

pytestmark = pytest.mark.e2e  # starts processes end to end (pyproject's markers)


def test_a_failed_phase_is_named_and_the_rest_still_reported(tmp_path):
    c = run_campaign(tmp_path, "c-partial", "debug=quick", "server.port=0", "nccl_burst:experiment.tokens=1",
                     "nccl_burst:experiment.communicator=torch",  # what is reported, not how
                     "macro:server.model_path=/nonexistent/checkpoint",
                     phases="nccl_burst macro report", timeout=600)
    p, runs = c.proc, c.runs
    assert p.returncode == 1  # macro failed ...
    assert "2 phase(s) ok (nccl_burst report), 1 failed (macro)" in p.stdout  # ... the report ran
    report = latest(runs, "report")
    m = report.data.metrics
    assert m["phases_missing"] == 6 and "tpot_ms" not in m
    burst = latest(runs, "nccl_burst", **{"experiment.tokens": "1"})
    assert m["comm_ms"] == pytest.approx(burst.data.metrics["burst_ms"])
    md = Path(report.data.tags["k25exp.output_dir"], "report.md").read_text()
    row = next(line for line in md.splitlines() if line.startswith("| TPOT at batch 1 (macro) |"))
    assert "missing" in row and "FAILED" in row and "/nonexistent/checkpoint" in row
    assert "Missing phases: all_to_all, allreduce_sweep, gemm, macro, profile, spec_decode." in md
    assert report.data.tags["report.missing_phases"] == "allreduce_sweep all_to_all gemm macro profile spec_decode"
    # without a campaign id the report takes the store's latest campaign
    env = {k: v for k, v in os.environ.items() if k != "K25EXP_CAMPAIGN"}
    env["MLFLOW_TRACKING_URI"] = f"sqlite:///{tmp_path}/mlflow.db"
    again = subprocess.run([warm_python(), "-m", "k25exp", "experiment=report", f"paths.outputs={tmp_path}"],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "campaign c-partial: " in again.stdout
