"""experiment=spec_decode spec=eagle3 against the real CPU build: the EAGLE-3 head k25exp builds
from the tiny model's config serves, and vLLM's own counters read the configured α."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest

from k25exp.serving.spec_acceptance import expected_tokens
from tests.serving.helpers import orphans

# one short run: the speculative server only (no baseline), batch 1
pytestmark = [pytest.mark.vllm, pytest.mark.xdist_group("servers"), pytest.mark.timeout(900)]

ALPHA, K = 0.7, 3


def _accepted_variance(alpha: float, k: int) -> float:
    """Var of the drafts a step accepts: P(A = j) = α^j (1 − α) for j < k, P(A = k) = α^k."""
    p = [alpha ** j * (1 - alpha) for j in range(k)] + [alpha ** k]
    mean = sum(j * pj for j, pj in enumerate(p))
    return sum(j * j * pj for j, pj in enumerate(p)) - mean ** 2


def test_an_eagle3_head_serves_at_the_configured_acceptance(k25):
    r = k25("experiment=spec_decode", "spec=eagle3", "debug=quick", "server.port=0",
            "server.enforce_eager=true", "experiment.baseline=false", "experiment.concurrency=[1]",
            f"experiment.alphas=[{ALPHA}]", f"experiment.num_speculative_tokens={K}",
            "experiment.input_tokens=16", "experiment.output_tokens=24",
            "experiment.requests=8",  # enough drafts that the counters' α means something
            timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (run,) = r.runs()
    tags = run.data.tags
    assert '"method": "eagle3"' in tags["spec.config"] and "-eagle3-" in tags["spec.config"]
    assert tags["spec.acceptance"] == "synthetic" and tags["spec.bound"].startswith("an EAGLE-3 head")
    assert not orphans(groups={int(tags["server.pid"])}), "vLLM processes left after the job"

    out = Path(tags["k25exp.output_dir"])
    rows = [x for x in csv.DictReader(open(out / "points.csv")) if x["server"] == "spec"]
    assert [float(x["alpha"]) for x in rows] == [ALPHA]
    (row,) = rows
    drafts = float(row["spec_drafts"])
    assert drafts >= 20, row
    # the first draft position is accepted with probability α: within 4 standard errors of a
    # binomial of that many drafts
    assert abs(float(row["acceptance_pos0"]) - ALPHA) <= 4 * math.sqrt(ALPHA * (1 - ALPHA) / drafts), row
    # an EAGLE head drafts k tokens at every step, so a step emits E(α, k) tokens on average
    assert float(row["spec_draft_tokens"]) == drafts * K
    tau = expected_tokens(ALPHA, K)
    assert abs(float(row["mean_acceptance_length"]) - tau) <= 4 * math.sqrt(
        _accepted_variance(ALPHA, K) / drafts), row
