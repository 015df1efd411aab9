"""Recovery on a real SQLite store, with runs whose process is really gone (or not)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from k25exp.tracking import liveness
from k25exp.tracking.liveness import where_tags
from k25exp.tracking.mlflow_store import MlflowStore
from k25exp.tracking.recover import names_folder, recover_stale


def _dead_pid_tags() -> dict:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    tags = where_tags(p.pid)
    p.wait()
    return tags


def test_names_folder_matches_the_folder_and_paths_inside_only():
    f = Path("/x/runs/12-00-00")
    assert names_folder(["torchrun", "/x/runs/12-00-00/raw/spec.json"], f)
    assert names_folder(["python", "hydra.run.dir=/x/runs/12-00-00"], f)
    assert not names_folder(["torchrun", "/x/runs/12-00-001/raw/spec.json"], f)


def test_dead_runs_end_killed_live_ones_are_left(tmp_path):
    store = MlflowStore(f"sqlite:///{tmp_path}/mlflow.db", str(tmp_path / "art"))
    out = tmp_path / "job"
    (out / "sub").mkdir(parents=True)
    (out / "sub" / "partial.csv").write_text("a,b\n1,2\n")
    dead = store.start_run("k25exp/gemm", tags={**_dead_pid_tags(), "k25exp.output_dir": str(out),
                                                "k25exp.experiment": "gemm"})
    alive = store.start_run("k25exp/gemm", tags=where_tags())
    far = store.start_run("k25exp/gemm", tags={**where_tags(), liveness.HOST: "another-host",
                                               liveness.HEARTBEAT: "1000.0",
                                               "k25exp.output_dir": "/nowhere/here"})
    legacy = store.start_run("k25exp/gemm")  # logged before where-tags existed

    done = {r.run_id: r for r in recover_stale(store, stale_after_s=60)}
    assert set(done) == {dead.run_id, far.run_id}
    assert {r.outcome for r in done.values()} == {"recovered"}
    c = store.client
    d = c.get_run(dead.run_id)
    assert d.info.status == "KILLED"
    # gemm recovers from samples.jsonl (its schema's hook), which this job never wrote
    assert d.data.tags["k25exp.recovered_figures"] == "nothing: no samples.jsonl"
    assert d.data.tags["k25exp.recovered_stopped"] == "none found"
    assert [a.path for a in c.list_artifacts(dead.run_id, "sub")] == ["sub/partial.csv"]
    f = c.get_run(far.run_id)
    assert f.info.status == "KILLED" and "no heartbeat from another-host" in f.data.tags["error"]
    assert "not on this host" in f.data.tags["k25exp.recovered_figures"]
    assert c.get_run(alive.run_id).info.status == "RUNNING"
    assert c.get_run(legacy.run_id).info.status == "RUNNING"
    assert recover_stale(store, stale_after_s=60) == []  # a second pass has nothing to do
    alive.end("FINISHED")
    legacy.end("FINISHED")


def _request(phase, level, chunks, sent=0.0, lag_ms=0.5):
    """A requests.jsonl record as the client writes it (times in s after the send)."""
    return {"phase": phase, "level": level, "ok": True, "sent_s": sent, "end_s": chunks[-1],
            "chunk_s": chunks, "ttft_s": chunks[0], "e2e_s": chunks[-1],
            "tpot_s": (chunks[-1] - chunks[0]) / (len(chunks) - 1), "output_tokens": len(chunks),
            "lag_ms": lag_ms}


def test_recovered_levels_are_never_called_valid(tmp_path):
    import json

    from k25exp.tracking import MemoryRecorder
    from k25exp.runners.macro_results import recover as _macro_figures

    even = [0.05 + 0.02 * i for i in range(8)]  # a token every 20 ms
    # 5 silent steps, then 4 chunks within 1 ms: a delivery stall (k25exp.load.stalls)
    stalled = [0.05 + 0.02 * i for i in range(3)] + [0.19, 0.1905, 0.191, 0.1915, 0.192]
    recs = ([_request("single", 1, even, sent=0.3 * i) for i in range(3)]
            + [_request("sweep", 1, even, sent=1.0 + 0.3 * i) for i in range(3)]
            + [_request("sweep", 2, even, sent=2.0), _request("sweep", 2, even, sent=2.0),
               _request("sweep", 2, stalled, sent=2.3)])
    (tmp_path / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    rec = MemoryRecorder()
    _macro_figures(tmp_path, rec)
    logged = {k for k, _, _ in rec.metrics}
    # nothing says the client kept up (its loop lag and CPU were not kept): no valid = 1, no
    # client_lagged = 0 anywhere
    assert "single_stream_valid" not in logged and "single_stream_client_lagged" not in logged
    assert "client_lagged" not in logged
    assert rec.latest("valid") == {2: 0.0}  # level 2's stall is evidence enough: invalid
    assert rec.latest("delivery_stalls") == {1: 0.0, 2: 1.0}
    assert "validity unknown" in rec.tags["k25exp.recovered_validity"]
    assert "levels [1]" in rec.tags["k25exp.recovered_validity"]
    assert "single stream" in rec.tags["k25exp.recovered_validity"]
    # the figures that were kept are the requests' own: TPOT 20 ms per token
    assert rec.latest("single_stream_tpot_ms")[None] == pytest.approx(20.0)


def test_a_level_with_a_failed_client_process_is_recovered_from_what_was_sent(tmp_path):
    """A level over client processes where one died: its unsent requests are recorded failed,
    never sent (no sent_s, end_s); the level's figures come from the requests that were."""
    import json

    from k25exp.load.shards import ShardPool
    from k25exp.tracking import MemoryRecorder
    from k25exp.runners.macro_results import recover as _macro_figures

    even = [0.05 + 0.02 * i for i in range(8)]
    res = {"records": [{**_request("sweep", 2, even, sent=t), "i": i} for i, t in enumerate((1.0, 1.5))],
           "_shards": [type("S", (), {"state": "failed", "k": 1, "proc": None,
                                      "error": "exited during the phase (exit code -9)",
                                      "alive": lambda self: False})()]}
    ShardPool._account(None, res, [], lambda k, reported: [7], "sweep", 2, 64, 128)
    lost = res["records"][-1]
    assert lost["ok"] is False and lost.get("sent_s") is None and "exit code -9" in lost["error"]
    (tmp_path / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in res["records"]))
    rec = MemoryRecorder()
    _macro_figures(tmp_path, rec)
    # 2 ok requests of 8 tokens over 1.0 .. 1.5 + 0.19 s: 16 tokens / 0.69 s
    assert rec.latest("output_tok_s")[2] == pytest.approx(16 / 0.69)
    assert rec.latest("errors")[2] == 1.0


def test_a_killed_gemm_jobs_timed_figures_come_back_from_its_samples(tmp_path):
    """The gemm schema's recovery hook: every figure timed before the job died, its median
    and p90 (with 10 calls or more) recomputed here by hand; a torn last line is skipped."""
    import json

    from k25exp.tracking import MemoryRecorder
    from k25exp.tracking.recover import recompute

    calls = [10.0, 12.0, 11.0, 13.0, 9.0, 14.0, 10.5, 11.5, 12.5, 30.0]
    lines = [json.dumps({"figure": "expert_down.tp2/torch_bf16/latency_us", "step": 4,
                         "samples_us": calls}),
             json.dumps({"figure": "moe.tp2/vllm_fused_moe/latency_us", "step": 1,
                         "samples_us": [50.0, 52.0, 51.0]}),
             '{"figure": "expert_down.tp2/marlin/lat']  # the line being written at the kill
    (tmp_path / "samples.jsonl").write_text("\n".join(lines))
    rec = MemoryRecorder()
    what = recompute("gemm", tmp_path, rec)
    assert what.startswith("gemm: 2 timed figure(s) from samples.jsonl")
    srt = sorted(calls)  # median of 10: mean of the 5th and 6th; p90: 9th + 0.1 × (10th − 9th)
    assert rec.latest("expert_down.tp2/torch_bf16/latency_us") == {4: (srt[4] + srt[5]) / 2}
    assert rec.latest("expert_down.tp2/torch_bf16/latency_us_p90")[4] == pytest.approx(
        srt[8] + 0.1 * (srt[9] - srt[8]))
    assert rec.latest("moe.tp2/vllm_fused_moe/latency_us") == {1: 51.0}
    assert "moe.tp2/vllm_fused_moe/latency_us_p90" not in {k for k, _, _ in rec.metrics}  # 3 calls



def _store_with_a_dead_run(tmp_path):
    store = MlflowStore(f"sqlite:///{tmp_path}/mlflow.db", str(tmp_path / "art"))
    dead = store.start_run("k25exp/gemm", tags={**_dead_pid_tags(), "k25exp.experiment": "gemm"})
    return store, dead.run_id


def test_a_job_leaves_other_runs_alone_a_multirun_start_recovers_them(tmp_path):
    """open_run as a job calls it never searches the store; as the multirun's parent calls it
    (recover=True), it ends the dead jobs' runs before its own starts."""
    from k25exp.config.schema import TrackingConfig
    from k25exp.tracking.runs import open_run

    store, dead = _store_with_a_dead_run(tmp_path)
    tracking = TrackingConfig(uri=store.uri, artifact_root=str(tmp_path / "art"),
                              experiment_name="k25exp/gemm", heartbeat_s=0)
    job = open_run(tracking, tmp_path / "job", "job", {})
    assert store.client.get_run(dead).info.status == "RUNNING"
    parent = open_run(tracking, tmp_path / "sweep", "multirun", {}, role="parent", recover=True)
    d = store.client.get_run(dead)
    assert d.info.status == "KILLED" and "k25exp.recovered" in d.data.tags
    assert store.client.get_run(job.run_id).info.status == "RUNNING"  # alive: left alone
    job.end("FINISHED")
    parent.end("FINISHED")


@pytest.mark.e2e
def test_a_single_job_does_not_recover_a_multirun_does(k25, tmp_path):
    """The real CLI on a store holding a dead job's run: `python -m k25exp ...` leaves it
    RUNNING (what a user sees until something recovers it); the next multirun ends it KILLED."""
    from tests.conftest import LIGHT_JOB, seed_store

    outputs = tmp_path / "outputs"  # where the k25 fixture's jobs log, artifacts beside the store
    seed_store(outputs)
    store = MlflowStore(f"sqlite:///{outputs}/mlflow.db", str(outputs / "mlartifacts"))
    dead = store.start_run("k25exp/gemm", tags={**_dead_pid_tags(), "k25exp.experiment": "gemm"}).run_id
    r = k25(*LIGHT_JOB)
    assert r.returncode == 0, r.stderr[-3000:]
    assert store.client.get_run(dead).info.status == "RUNNING"
    r = k25("-m", *LIGHT_JOB)
    assert r.returncode == 0, r.stderr[-3000:]
    d = store.client.get_run(dead)
    assert d.info.status == "KILLED", d.data.tags
    assert f"run {dead} of a dead job: recovered" in r.stdout + r.stderr
