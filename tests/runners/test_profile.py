"""experiment=profile against the real vLLM CPU server (TP 2), and the analyser on the traces
that server wrote: the session campaign's profile phase (tests/conftest.py)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from k25exp.config.validate import ConfigError, to_typed
from k25exp.traces import analyze, load_rules
from tests.conftest import PROFILE_OUT, ROOT, compose_cfg, warm_python


class Logged:
    """A finished run's metrics and tags, in the shape the assertions below read."""

    def __init__(self, client, run):
        self.tags = run.data.tags
        self.keys = set(run.data.metrics)
        self.history = {k: {h.step: h.value for h in client.get_metric_history(run.info.run_id, k)}
                        for k in ("server_starts",)}


@pytest.fixture
def profiled(campaign_full):
    """The session campaign's profile run at concurrency 1 (the first of its sweep, on a
    fresh server): (metrics, logged, run folder, requests profiled)."""
    runs = [r for r in campaign_full.runs if r.data.tags.get("k25exp.experiment") == "profile"
            and r.data.params.get("experiment.concurrency") == "1"]
    (run,) = runs
    requests = max(int(run.data.params["experiment.requests"]), 1)
    return (run.data.metrics, Logged(campaign_full.client, run), Path(run.data.tags["k25exp.output_dir"]),
            requests)


@pytest.mark.vllm
def test_decode_steps_found_on_both_ranks_and_shares_add_up(profiled):
    metrics, rec, out, requests = profiled
    traces = sorted((out / "traces").iterdir())
    assert len(traces) == 2 and all(t.name.endswith(".pt.trace.json.gz") for t in traces)
    # one request at a time: each has PROFILE_OUT - 1 pure-decode steps (its first token
    # comes from the prefill step), on every rank
    assert metrics["steps_analysed"] == requests * (PROFILE_OUT - 1)
    categories = load_rules().categories
    for rank in ("rank0", "rank1"):
        table = {row["category"]: row for row in _csv(out / "breakdown" / "breakdown.csv")}
        total = sum(float(table[c][rank]) for c in categories) + float(table["idle"][rank])
        assert total == pytest.approx(100.0, abs=0.05)
    total = sum(metrics[f"share_{c}"] for c in categories) + metrics["share_idle"]
    assert total == pytest.approx(100.0, abs=0.05)
    # the CPU build's decode step: shm all-reduce, fused MoE, MLA attention, oneDNN GEMMs
    assert metrics["allreduce_share"] > 0 and metrics["allreduce_share"] == metrics["share_comm_allreduce"]
    assert metrics["share_moe"] > 0 and metrics["share_attention"] > 0 and metrics["share_gemm"] > 0
    assert rec.tags["trace.step_source"] == "user_annotation"
    assert rec.history["server_starts"] == {0: 1.0}
    assert "stop_profile_s" in rec.keys
    assert not rec.keys & {"tpot_ms_p50", "output_tok_s"}  # never reported


SPLIT = ("share_comm_wait", "share_comm_transport", "comm_wait_ms_per_step",
         "comm_transport_ms_per_step", "comm_raw_ms_per_step", "comm_calls_matched")


@pytest.mark.vllm
def test_collectives_split_into_wait_and_transport_on_both_ranks(profiled):
    metrics, rec, out, _ = profiled
    logged = rec.keys
    for k in SPLIT:
        assert {k, f"{k}_min", f"{k}_median", f"{k}_max"} <= logged, k
    table = {row["category"]: row for row in _csv(out / "breakdown" / "breakdown.csv")}
    assert {"[comm_wait]", "[comm_transport]", "comm_raw_ms"} <= set(table)
    a = analyze(sorted((out / "traces").iterdir()))
    assert [r.label for r in a.ranks] == ["rank0", "rank1"] and a.comm_split.reason is None
    for r in a.ranks:
        sp, m = r.comm_split, r.metrics()
        # the calls counted straight from the JSON: outermost communication cpu_ops that
        # start inside a pure-decode step annotation
        durations_us = _comm_calls_us(r.path)
        assert m["comm_calls_matched"] > 0
        assert m["comm_calls_matched"] + m["comm_calls_unmatched"] + sp.calls_unsplittable \
            == len(durations_us)
        assert (sp.wait_ns >= 0).all() and (sp.transport_ns >= 0).all()
        assert (sp.wait_ns + sp.transport_ns == sp.raw_ns).all()     # every step and category
        assert m["comm_wait_ms_per_step"] + m["comm_transport_ms_per_step"] == \
            pytest.approx(m["comm_raw_ms_per_step"])
        if m["comm_calls_unmatched"] == sp.calls_unsplittable == 0:  # every call split
            assert sp.raw_ns.sum() / 1e3 == pytest.approx(sum(durations_us),
                                                          abs=1e-3 * len(durations_us))
        assert m["comm_raw_ms_per_step"] * 1e3 <= sum(durations_us) / r.steps_analysed + 1e-3
        # one denominator with the shares: Σ step length
        assert m["share_comm_wait"] + m["share_comm_transport"] == pytest.approx(
            100 * m["comm_raw_ms_per_step"] / m["decode_step_ms"])


def _comm_calls_us(path) -> list[float]:
    import gzip
    import math
    import re

    rules = load_rules()
    comm = set(rules.groups["communication"])
    events = json.load(gzip.open(path))["traceEvents"]
    steps = [(e["ts"], e["ts"] + e["dur"]) for e in events
             if e.get("cat") == "user_annotation"
             and re.fullmatch(r"execute_context_0\(0\)_generation_[1-9]\d*\(\d+\)", e["name"])]
    ops = sorted((str((e["pid"], e["tid"])), e["ts"], -e["dur"]) for e in events
                 if e.get("ph") == "X" and e.get("cat") == "cpu_op"
                 and rules.classify(e["name"], "cpu_op") in comm)
    out, reach = [], {}
    for lane, s, neg_dur in ops:  # by lane, start, longest first: an op inside an earlier one
        e = s - neg_dur           # is nested in it
        if s >= reach.get(lane, -math.inf) and any(a <= s < b for a, b in steps):
            out.append(e - s)
        reach[lane] = max(reach.get(lane, -math.inf), e)
    return out


@pytest.mark.vllm
def test_analyze_cli_on_the_real_traces_agrees(profiled):
    metrics, _, out, _ = profiled
    r = subprocess.run([warm_python(), "-m", "k25exp", "analyze", "--json", str(out / "traces")],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    figures = json.loads(r.stdout)["metrics"]
    assert figures["allreduce_share"] == pytest.approx(metrics["allreduce_share"])
    assert figures["decode_step_ms"] == pytest.approx(metrics["decode_step_ms"])


def test_profile_needs_a_profiler_config():
    with pytest.raises(ConfigError, match="experiment=profile needs"):
        to_typed(compose_cfg("experiment=profile", "server.profiler=null"), gpu_count=lambda: 0)
    with pytest.raises(ConfigError, match="experiment.trace_dir: required with server=endpoint"):
        to_typed(compose_cfg("experiment=profile", "server=endpoint",
                             "server.base_url=http://127.0.0.1:1"), gpu_count=lambda: 0)


@pytest.mark.e2e
def test_analyze_cli_names_a_bad_file(tmp_path):
    bad = tmp_path / "rank0.pt.trace.json.gz"
    bad.write_bytes(b"\x1f\x8b\x08\x00truncated")
    r = subprocess.run([warm_python(), "-m", "k25exp", "analyze", str(bad)], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and str(bad) in r.stderr


def _csv(path):
    import csv

    return list(csv.DictReader(open(path)))
