"""experiment=profile against the real vLLM CPU server (TP 2), and the analyser on the traces
that server wrote."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from k25exp.config.validate import ConfigError, to_typed
from k25exp.runners import profile
from k25exp.serving import server
from k25exp.traces import analyze, load_rules
from k25exp.tracking import MemoryRecorder
from tests.conftest import ROOT, compose_cfg


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    """One profile job in this process: (metrics, recorder, output folder)."""
    tmp = tmp_path_factory.mktemp("profile")
    cfg = to_typed(compose_cfg(
        "experiment=profile", f"server.port={server.free_port()}", f"server.log_dir={tmp / 'logs'}",
        f"server.profiler.torch_profiler_dir={tmp / 'profiles'}", "server.max_model_len=512",
        "experiment.iters=2", "experiment.output_tokens=16"), gpu_count=lambda: 0)
    rec = MemoryRecorder()
    ours: set[int] = set()
    try:
        metrics = profile.run(cfg, tmp / "out", rec)
        ours = {p for s in server.running() for p in s.pids()}
        assert ours, "the profile server should still be registered for reuse"
        yield metrics, rec, tmp / "out"
    finally:
        server.stop_all()
        # only this server's processes: another server may run on the machine
        survivors = [p for p in ours if os.path.exists(f"/proc/{p}") and
                     open(f"/proc/{p}/stat").read().split(")")[-1].split()[0] != "Z"]
        assert not survivors, f"processes of the profile server survived: {survivors}"


def test_decode_steps_found_on_both_ranks_and_shares_add_up(profiled):
    metrics, rec, out = profiled
    traces = sorted((out / "traces").iterdir())
    assert len(traces) == 2 and all(t.name.endswith(".pt.trace.json.gz") for t in traces)
    assert metrics["steps_analysed"] >= 10  # 2 requests × 15 decode steps, per rank
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
    assert rec.latest("server_starts")[None] == 1.0
    assert "stop_profile_s" in {k for k, _, _ in rec.metrics}
    assert not {k for k, _, _ in rec.metrics} & {"tpot_ms_p50", "output_tok_s"}  # never reported


SPLIT = ("share_comm_wait", "share_comm_transport", "comm_wait_ms_per_step",
         "comm_transport_ms_per_step", "comm_raw_ms_per_step", "comm_calls_matched")


def test_collectives_split_into_wait_and_transport_on_both_ranks(profiled):
    metrics, rec, out = profiled
    logged = {k for k, _, _ in rec.metrics}
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


def test_analyze_cli_on_the_real_traces_agrees(profiled):
    metrics, _, out = profiled
    r = subprocess.run([sys.executable, "-m", "k25exp", "analyze", "--json", str(out / "traces")],
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


def test_analyze_cli_names_a_bad_file(tmp_path):
    bad = tmp_path / "rank0.pt.trace.json.gz"
    bad.write_bytes(b"\x1f\x8b\x08\x00truncated")
    r = subprocess.run([sys.executable, "-m", "k25exp", "analyze", str(bad)], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and str(bad) in r.stderr


def _csv(path):
    import csv

    return list(csv.DictReader(open(path)))
