"""experiment=spec_decode experiment.draft_lengths against the real CPU build: two draft
lengths in one job, each its own n-gram server, beside one baseline start; every point's
speedup worked out by hand from points.csv against that one baseline."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest

from tests.serving.helpers import orphans

pytestmark = [pytest.mark.vllm, pytest.mark.xdist_group("servers"), pytest.mark.timeout(1200)]

ALPHA = 0.9


def test_two_draft_lengths_share_one_baseline(k25):
    r = k25("experiment=spec_decode", "spec=ngram", "debug=quick", "server.port=0",
            "server.enforce_eager=true", "experiment.baseline_sync=false",
            "experiment.concurrency=[1]", f"experiment.alphas=[{ALPHA}]",
            "experiment.num_speculative_tokens=2", "experiment.draft_lengths=[1,2]",
            "experiment.input_tokens=16", "experiment.output_tokens=24", "experiment.requests=8",
            timeout=1200)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (run,) = r.runs()
    tags, m = run.data.tags, run.data.metrics
    assert tags["spec.num_speculative_tokens"] == "2,1"   # num_speculative_tokens first
    assert not orphans(groups={int(tags["server.pid"])}), "vLLM processes left after the job"
    # one baseline start for both speculative servers; each of those its own start
    assert m["baseline/server_starts"] == 1 and m["server_starts"] == 1
    out = Path(tags["k25exp.output_dir"])
    rows = list(csv.DictReader(open(out / "points.csv")))
    (base,) = [x for x in rows if x["server"] == "baseline"]
    spec = {int(x["k"]): x for x in rows if x["server"] == "spec"}
    assert sorted(spec) == [1, 2] and all(x["round"] == "1" and x["level"] == "1" for x in rows)
    for k, x in spec.items():
        drafts, drafted = float(x["spec_drafts"]), float(x["spec_draft_tokens"])
        assert drafts >= 20, x
        # a server drafts at most its own k per step: k = 1 exactly one token per draft
        assert drafts <= drafted <= k * drafts, x
        # its first position accepted at α: within 4 standard errors of a binomial
        assert abs(float(x["acceptance_pos0"]) - ALPHA) <= 4 * math.sqrt(ALPHA * (1 - ALPHA) / drafts), x
        # the point against the job's one baseline, by hand
        assert m[f"k{k}/a{ALPHA:g}/base_tpot_ms_med"] == pytest.approx(float(base["tpot_ms_p50"]))
        assert m[f"k{k}/a{ALPHA:g}/speedup_med"] == pytest.approx(
            float(base["tpot_ms_p50"]) / float(x["tpot_ms_p50"]))
    assert float(spec[1]["spec_draft_tokens"]) == float(spec[1]["spec_drafts"])
    # round 1's headline figures are the first k's (spec/), the other k's folder its own
    assert m["tpot_ms_p50"] == pytest.approx(float(spec[2]["tpot_ms_p50"]))
    assert (out / "rounds" / f"r1_spec_k1_a{ALPHA:g}" / "requests.jsonl").exists()


def test_baseline_beside_starts_a_baseline_next_to_each_speculative_server(k25):
    """experiment.baseline_beside: B S2 B S1 B, every server started afresh; each k's speedup
    against the mean of the two baselines measured next to it, by hand from points.csv."""
    r = k25("experiment=spec_decode", "spec=ngram", "debug=quick", "server.port=0",
            "server.enforce_eager=true", "experiment.baseline_sync=false",
            "experiment.concurrency=[1]", f"experiment.alphas=[{ALPHA}]",
            "experiment.num_speculative_tokens=2", "experiment.draft_lengths=[1,2]",
            "experiment.baseline_beside=true",
            "experiment.input_tokens=16", "experiment.output_tokens=24", "experiment.requests=8",
            timeout=1200)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (run,) = r.runs()
    tags, m = run.data.tags, run.data.metrics
    assert not orphans(groups={int(tags["server.pid"])}), "vLLM processes left after the job"
    out = Path(tags["k25exp.output_dir"])
    rows = list(csv.DictReader(open(out / "points.csv")))
    assert [(x["server"], x["k"], x["slot"]) for x in rows] == [
        ("baseline", "", "0"), ("spec", "2", "1"), ("baseline", "", "2"), ("spec", "1", "3"),
        ("baseline", "", "4")]
    b = [float(x["tpot_ms_p50"]) for x in rows if x["server"] == "baseline"]
    spec = {int(x["k"]): float(x["tpot_ms_p50"]) for x in rows if x["server"] == "spec"}
    for k, near in ((2, (b[0] + b[1]) / 2), (1, (b[1] + b[2]) / 2)):
        assert m[f"k{k}/a{ALPHA:g}/base_tpot_ms_med"] == pytest.approx(near)
        assert m[f"k{k}/a{ALPHA:g}/speedup_med"] == pytest.approx(near / spec[k])
    # the later baselines' requests kept in their own folders (compare pools them)
    for slot in (2, 4):
        assert (out / "rounds" / f"r1s{slot}_baseline" / "requests.jsonl").exists()
