"""A served job (fake vLLM server) SIGKILLed mid-level: its run ends KILLED with the finished
levels' figures and requests.jsonl, and no server process is left.

What happens to the server: it runs in a session of its own (the job's process-group kill
does not reach it), but it was started with PR_SET_PDEATHSIG (k25exp.serving.process), so
the kernel sends it SIGTERM when the job dies; the fake server exits on SIGTERM as vLLM does.
This test checks that no fake-server process is left without any help from recovery.
"""

from __future__ import annotations

import json

import pytest

from k25exp.poll import wait_until
from tests.faults.helpers import artifact_paths, kill_job_when, only_run, recover, start_job
from tests.serving.helpers import fake_marks, fake_model, fake_overrides, vllm_processes

pytestmark = pytest.mark.e2e  # starts processes end to end (pyproject's markers)


# Its orphan check looks only at this test's fake servers, so it runs beside the servers
# worker rather than in it.


def fake_servers_of(folder) -> list[int]:
    """Live fake-server processes started for this test (serving folder/model; other tests on
    this machine may run fake servers of their own)."""
    return [pid for pid, _ in vllm_processes(marks=fake_marks(folder / "model"))]


def _sweep_level_written(path) -> bool:
    if not path.exists():
        return False
    for line in path.read_text().splitlines():
        try:
            if json.loads(line)["phase"] == "sweep":
                return True
        except (json.JSONDecodeError, KeyError):
            pass
    return False


def test_sigkill_mid_level_then_recover(tmp_path):
    outputs, run_dir = tmp_path / "outputs", tmp_path / "run"
    uri = f"sqlite:///{outputs}/mlflow.db"
    args = fake_overrides(fake_model(tmp_path / "model"), tmp_path / "server_logs", "FAKE_VLLM_GAP_MS=40")
    # tracking.heartbeat_s=0: the job's buffered figures are never flushed before the kill, so
    # what the store holds after recovery is recovery's alone (every 30 s, a heartbeat landing
    # after the single stream on a loaded machine stored the job's own single_stream_valid = 1,
    # and a level flushed too would be logged twice)
    job = start_job(outputs, run_dir, *args, "debug=quick", "experiment.concurrency=[1,2,4]",
                    "experiment.single_stream_requests=2", "experiment.requests=4",
                    "experiment.input_tokens=16", "experiment.output_tokens=24",
                    "experiment.progress=false", "tracking.heartbeat_s=0")
    # The first level's records are written once it is over; the second takes ~2 s.
    kill_job_when(job, lambda: _sweep_level_written(run_dir / "requests.jsonl"), 120,
                  "the first concurrency level was written")
    assert wait_until(lambda: not fake_servers_of(tmp_path), 10, 0.1, "fake server gone",
                      raise_timeout=False), f"fake server outlived the job: {fake_servers_of(tmp_path)}"

    r = recover(uri)
    assert r.returncode == 0 and "1 recovered" in r.stdout, r.stdout + r.stderr
    c, run = only_run(uri)
    tags = run.data.tags
    assert run.info.status == "KILLED"
    assert "macro: single-stream phase, 1 finished concurrency level(s) [1]" in tags["k25exp.recovered_figures"]
    assert [m.step for m in c.get_metric_history(run.info.run_id, "output_tok_s")] == [1]
    # the recovered figures, recomputed by hand from the records the job left
    recs = [json.loads(line) for line in (run_dir / "requests.jsonl").read_text().splitlines()
            if line.strip()]
    single = [r for r in recs if r["phase"] == "single" and r["ok"]]
    tpots = sorted((r["chunk_s"][-1] - r["chunk_s"][0]) / (r["output_tokens"] - 1) * 1e3
                   for r in single)
    assert len(tpots) == 2  # experiment.single_stream_requests: the median is their mean
    assert run.data.metrics["single_stream_tpot_ms"] == pytest.approx((tpots[0] + tpots[1]) / 2)
    level = [r for r in recs if r["phase"] == "sweep" and r["level"] == 1]
    wall = max(r["sent_s"] + r["end_s"] for r in level) - min(r["sent_s"] for r in level)
    tok_s = sum(r["output_tokens"] for r in level if r["ok"]) / wall
    assert c.get_metric_history(run.info.run_id, "output_tok_s")[0].value == pytest.approx(tok_s)
    assert run.data.metrics["peak_output_tok_s"] == pytest.approx(tok_s)
    assert run.data.metrics["peak_concurrency"] == 1
    # the client's health was not kept: no level is called valid, and the run says why
    assert 1.0 not in {m.value for m in c.get_metric_history(run.info.run_id, "valid")}
    assert run.data.metrics.get("single_stream_valid", 0.0) == 0.0
    assert "validity unknown" in tags["k25exp.recovered_validity"]
    arts = artifact_paths(c, run.info.run_id)
    assert {"requests.jsonl", "config.resolved.yaml", "plots/throughput_vs_concurrency.png"} <= arts, arts
    assert not fake_servers_of(tmp_path)
