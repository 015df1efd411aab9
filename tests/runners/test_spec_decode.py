"""experiment=spec_decode against the real CPU build: n-gram lookup and the self-draft, each
beside the baseline server, in one multirun (so the second job reuses the baseline server):
the session campaign's spec_decode phase."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import SPEC_K as K
from tests.test_job import artifact_paths

# The session's campaign (tests/conftest.py) ran spec=ngram,self_draft as one multirun.
pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1800)]


@pytest.fixture
def sweep(campaign_full):
    """(client, parent run, child runs) of the campaign's spec_decode multirun."""
    runs = campaign_full.all_runs()
    kids = [r for r in runs if r.data.tags.get("k25exp.experiment") == "spec_decode"]
    parents = {r.data.tags.get("mlflow.parentRunId") for r in kids}
    assert len(parents) == 1, "both spec_decode jobs belong to one multirun"
    (parent,) = [r for r in runs if r.info.run_id in parents]
    return campaign_full.client, parent, kids


def _counters(m: dict, prefix: str = "single_stream_") -> dict:
    return {k[len(prefix):]: v for k, v in m.items() if k.startswith(prefix)}


def test_acceptance_counters_are_read_and_consistent(sweep):
    _, parent, kids = sweep
    assert parent.info.status == "FINISHED" and len(kids) == 2
    by = {x.data.params["experiment.method"]: x for x in kids}
    for method, run in by.items():
        m = run.data.metrics
        assert run.info.status == "FINISHED"
        c = _counters(m)
        drafts, drafted, accepted = c["spec_drafts"], c["spec_draft_tokens"], c["spec_accepted_tokens"]
        assert drafts > 0 and 0 <= accepted <= drafted <= drafts * K
        assert c["acceptance_rate"] == pytest.approx(accepted / drafted)
        assert c["mean_accepted_tokens"] == pytest.approx(accepted / drafts) and c["mean_accepted_tokens"] <= K
        pos = [c[f"acceptance_pos{i}"] for i in range(K)]
        assert sum(p * drafts for p in pos) == pytest.approx(accepted)  # per position adds up
        assert pos == sorted(pos, reverse=True)  # position i needs every position before it
        # the server's figures are for the tokens the client received: exact lengths, no errors
        assert m["single_stream_errors"] == 0 and m["output_tokens_mismatch"] == 0
        # the baseline ran without speculative decoding, in the same job
        assert "baseline/single_stream_tpot_ms" in m
        assert not [k for k in m if k.startswith("baseline/") and "accept" in k]
        # at batch 1 every step is its own chunk: 1 token without a draft, 1 + accepted with one
        # (the counter also counts tokens accepted past max_tokens, so never fewer than streamed)
        assert m["baseline/single_stream_tokens_per_chunk"] <= 1.1
        assert 1.0 <= m["single_stream_tokens_per_chunk"] <= 1 + K
        assert m["single_stream_tokens_per_chunk"] - 1 <= c["mean_accepted_tokens"] + 1e-9
        assert m["spec_speedup"] == pytest.approx(m["baseline/single_stream_tpot_ms"] / m["single_stream_tpot_ms"])
        assert m["level_spec_speedup"] == pytest.approx(m["baseline/tpot_ms_p50"] / m["tpot_ms_p50"])
    # a draft model proposes k tokens at every step; n-gram lookup only where it finds a match
    d = _counters(by["draft_model"].data.metrics)
    assert d["spec_draft_tokens"] == d["spec_drafts"] * K
    assert by["draft_model"].data.tags["spec.bound"].startswith("the served checkpoint as its own draft")
    assert '"method": "draft_model"' in by["draft_model"].data.tags["spec.config"]


def test_the_baseline_server_is_started_once_for_the_sweep(sweep):
    client, _, kids = sweep
    kids.sort(key=lambda x: x.info.start_time)
    first, second = (k.data.metrics for k in kids)
    assert first["server_starts"] == 1 and first["baseline/server_starts"] == 1
    assert second["baseline/server_starts"] == 0 and second["server_starts"] == 1
    # the baseline without async scheduling: its own start in each job (the baseline is left
    # running for the next one)
    assert first["baseline_sync/server_starts"] == 1 and second["baseline_sync/server_starts"] == 1
    assert "--no-async-scheduling" in kids[0].data.tags["baseline_sync/server.launch_key"] or \
        kids[0].data.tags["baseline_sync/server.launch_key"] != kids[0].data.tags["baseline/server.launch_key"]
    assert kids[0].data.tags["baseline/server.launch_key"] == kids[1].data.tags["baseline/server.launch_key"]
    assert kids[0].data.tags["server.launch_key"] != kids[1].data.tags["server.launch_key"]
    arts = set(artifact_paths(client, kids[0].info.run_id))
    assert {"spec/requests.jsonl", "baseline/requests.jsonl", "spec/server.log", "results.csv"} <= arts


def test_the_synthetic_acceptance_is_what_the_servers_counters_read(sweep):
    """Each α of the sweep set in the server's workers between levels (one start): the first
    draft position is accepted with probability α, so vLLM's own counters over a level read
    α within 4 standard errors of a binomial of that many drafts, worked out here; and a
    draft model (k drafts at every step) emits E(α, k) = 1 + α + … + α^k tokens per step."""
    import csv
    import math

    client, _, kids = sweep
    for run in kids:
        assert run.data.tags["spec.acceptance"] == "synthetic"
        assert run.data.tags["spec.alphas"] == "0.5,0.9"
        out = Path(run.data.tags["k25exp.output_dir"])
        rows = [r for r in csv.DictReader(open(out / "points.csv")) if r["server"] == "spec"]
        assert sorted({float(r["alpha"]) for r in rows}) == [0.5, 0.9]
        for r in rows:
            a, drafts = float(r["alpha"]), float(r["spec_drafts"])
            assert drafts >= 20, r
            assert abs(float(r["acceptance_pos0"]) - a) <= 4 * math.sqrt(a * (1 - a) / drafts), r
            if run.data.params["experiment.method"] == "draft_model":
                # E(α, 3) by hand: 1.875 at 0.5, 3.439 at 0.9; per step the accepted count
                # has variance Var = E[A²] − E[A]² (A = accepted drafts, 0 … 3):
                # α = 0.5: E[A²] = .25 + .5 + 1.125 = 1.875, E[A] = .875 → Var 1.109;
                # α = 0.9: P(A) = .1, .09, .081, .729 → E[A] 2.439, E[A²] 6.975 → Var 1.026
                tau, var = {0.5: (1.875, 1.109), 0.9: (3.439, 1.026)}[a]
                assert abs(float(r["mean_acceptance_length"]) - tau) <= 4 * math.sqrt(var / drafts), r
        # where the CPU build has no synthetic kernel, k25exp's port ran, and the run says so
        assert "spec.sampler" in run.data.tags
