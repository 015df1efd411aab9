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
from k25exp.traces import load_rules
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
