"""experiment=macro end to end: the real CLI, a real SQLite store, and as the server the fake
vLLM server (tests/serving/fake_vllm_server.py: no model) launched through the real launch
code, since what is tested here is the server's lifecycle (when servers start and are reused,
a crash mid-level, signals while one starts), not what vLLM computes
(tests/serving/test_macro_runner.py checks that on the real server).

Each CLI process launches its own server and must leave no server process behind, whatever
happened to it.
"""

from __future__ import annotations

import signal
import subprocess
import sys

import orjson
import pytest

from k25exp.poll import wait_until
from k25exp.serving.server import free_port
from tests.conftest import ROOT
from tests.serving.helpers import fake_marks, fake_model, fake_overrides, orphans, vllm_processes
from tests.test_job import artifact_paths

pytestmark = pytest.mark.fake_server  # one xdist worker runs every server test, in order

TINY = ["experiment.input_tokens=16",
        "experiment.concurrency=[1,2]", "experiment.single_stream_requests=2",
        "experiment.warmup=1", "experiment.rounds=2", "experiment.min_requests=2"]
# p90 / p99 need 10 / 100 samples: levels of a few requests log medians with their counts
CONTRACT = {"ttft_ms_p50", "ttft_ms_n", "tpot_ms_p50", "tpot_ms_n", "tpot_ms_p50_ci_lo",
            "tpot_ms_p50_ci_hi", "itl_ms_p50", "e2e_ms_p50", "ttft_sched_ms_p50",
            "output_tok_s", "request_s", "errors", "server_tpot_ms_mean", "server_ttft_ms_mean",
            "single_stream_tpot_ms", "peak_output_tok_s", "server_starts"}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return fake_model(tmp_path_factory.mktemp("fake_model"))


def fake(model, tmp_path, *env):
    return fake_overrides(model, tmp_path / "server_logs", "FAKE_VLLM_WORKERS=2", *env)


def children(r):
    runs = r.runs()
    (parent,) = [x for x in runs if x.data.tags.get("k25exp.role") == "parent"]
    return parent, [x for x in runs if x.data.tags.get("mlflow.parentRunId") == parent.info.run_id]


def test_multirun_starts_one_server_per_distinct_server_setting(k25, model, tmp_path):
    # Hydra's basic sweeper varies the last key fastest: jobs run (8,4) (8,8) (16,4) (16,8).
    r = k25("-m", *fake(model, tmp_path), *TINY, "server.max_num_seqs=8,16",
            "experiment.output_tokens=4,8", timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    parent, kids = children(r)
    assert parent.info.status == "FINISHED" and len(kids) == 4
    kids.sort(key=lambda x: x.info.start_time)
    assert [x.data.metrics["server_starts"] for x in kids] == [1, 0, 1, 0]
    assert [x.data.params["server.max_num_seqs"] for x in kids] == ["8", "8", "16", "16"]
    keys = [x.data.tags["server.launch_key"] for x in kids]
    assert keys[0] == keys[1] != keys[2] == keys[3]
    assert [x.data.tags["server.reused"] for x in kids] == ["false", "true", "false", "true"]
    for x in kids:
        assert x.info.status == "FINISHED"
        assert CONTRACT <= set(x.data.metrics), sorted(CONTRACT - set(x.data.metrics))
        assert x.data.metrics.get("server_start_s", 1) > 0
        hist = r.client.get_metric_history(x.info.run_id, "tpot_ms_p50")
        assert sorted(m.step for m in hist) == [1, 2]  # step = concurrency
    arts = set(artifact_paths(r.client, kids[1].info.run_id))
    assert {"requests.jsonl", "results.csv", "server.log", "plots/latency_cdf.png",
            "plots/throughput_vs_concurrency.png", "plots/tpot_vs_concurrency.png"} <= arts
    assert not orphans(marks=fake_marks(model)), "server processes survived the multirun"


def test_a_context_sweep_shares_one_server_start_until_max_model_len_changes(k25, model, tmp_path):
    """experiment.input_tokens swept in one multirun: the prompt length is the client's, so
    the server starts once per server.max_model_len (jobs: (512, 16) (512, 32) (1024, 16)
    (1024, 32)); the one restart names the setting that changed and how to avoid it."""
    r = k25("-m", *fake(model, tmp_path), *TINY[1:], "experiment.output_tokens=4",
            "server.max_model_len=512,1024", "experiment.input_tokens=16,32", timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    _, kids = children(r)
    kids.sort(key=lambda x: x.info.start_time)
    assert [(x.data.params["server.max_model_len"], x.data.params["experiment.input_tokens"])
            for x in kids] == [("512", "16"), ("512", "32"), ("1024", "16"), ("1024", "32")]
    assert [x.data.metrics["server_starts"] for x in kids] == [1, 0, 1, 0]
    assert [x.data.tags["server.reused"] for x in kids] == ["false", "true", "false", "true"]
    # each level sent prompts of its job's length (the shape figures of every level)
    for x in kids:
        lens = {h.value for h in r.client.get_metric_history(x.info.run_id, "input_len_mean")}
        assert lens == {float(x.data.params["experiment.input_tokens"])}
    out = r.stdout + r.stderr
    assert out.count("restarting the server") == 1
    assert "(--max-model-len 512 → 1024)" in out
    assert "server.max_model_len is set once, to the longest prompt + output" in out
    assert not orphans(marks=fake_marks(model)), "server processes survived the multirun"


def test_server_killed_mid_level_fails_the_run_and_keeps_what_was_measured(k25, model, tmp_path):
    # Staggered: when the level's first request ends (and the fault kills the server), the
    # other is still streaming, so the level has both completed and failed requests.
    r = k25(*fake(model, tmp_path, "FAKE_VLLM_STAGGER=1"), *TINY, "experiment.concurrency=[1,2,4]",
            "experiment.output_tokens=32", "experiment.fault.kill_server_at_level=2", timeout=300)
    assert r.returncode == 1
    (run,) = r.runs()
    assert run.info.status == "FAILED"
    err = run.data.tags["error"]
    assert "vLLM died during level concurrency=2" in err and "last lines of its log" in err
    assert run.data.tags["error_type"] == "ServerDied"
    c = r.client
    assert [m.step for m in c.get_metric_history(run.info.run_id, "tpot_ms_p50")] == [1]
    assert {m.step for m in c.get_metric_history(run.info.run_id, "errors")} == {1, 2}
    assert run.data.metrics["single_stream_tpot_ms"] > 0
    local = c.download_artifacts(run.info.run_id, "requests.jsonl")
    recs = [orjson.loads(x) for x in open(local, "rb").read().splitlines()]
    level2 = [x for x in recs if x["phase"] == "sweep" and x["level"] == 2]
    assert any(x["ok"] for x in level2) and any(not x["ok"] for x in level2)
    assert {"server.log", "error.txt", "results.csv"} <= set(artifact_paths(c, run.info.run_id))
    assert not orphans(marks=fake_marks(model)), "server processes survived the crash"


def test_unreachable_endpoint_fails_the_run_with_a_clear_error(k25, tmp_path):
    port = free_port()
    r = k25("experiment=macro", "server=endpoint", f"server.base_url=http://127.0.0.1:{port}",
            f"server.tokenizer={tmp_path}", "server.ready_timeout_s=1")
    assert r.returncode == 1
    (run,) = r.runs()
    assert run.info.status == "FAILED"
    assert f"endpoint http://127.0.0.1:{port} unreachable after 1 s" in run.data.tags["error"]
    assert run.data.metrics["server_starts"] == 0


def test_ctrl_c_or_sigterm_while_the_server_starts_leaves_nothing_behind(model, tmp_path):
    # Ctrl-C once the server's workers exist (the most processes to stop); SIGTERM as soon as
    # the API server process exists (before it has started anything itself). The fake server
    # starts its workers, then takes a minute to bind: the signal lands mid-start.
    for sig, stage in ((signal.SIGINT, "fake_vllm_server --worker"),
                       (signal.SIGTERM, "fake_vllm_server")):
        out = tmp_path / sig.name
        # A shell's background job inherits SIGINT ignored, and Python then never turns it
        # into KeyboardInterrupt: give the child the terminal's default, as a user's has.
        p = subprocess.Popen([sys.executable, "-m", "k25exp", *fake(model, out, "FAKE_VLLM_START_DELAY_S=60"),
                              *TINY, "tracking=none", f"paths.outputs={out}"], cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        try:
            def started() -> bool:
                assert p.poll() is None, p.stdout.read()[-3000:]
                return any(stage in c for _, c in vllm_processes(marks=fake_marks(model)))

            wait_until(started, 60, 0.1, f"the server's {stage!r} process")
            p.send_signal(sig)
            p.wait(timeout=60)
        finally:
            if p.poll() is None:
                p.kill()
        assert p.returncode != 0
        assert not orphans(marks=fake_marks(model)), f"server processes survived {sig.name}"
