"""End to end: the real CLI, real torchrun gloo ranks, a real SQLite MLflow store."""

from __future__ import annotations

import pytest
import yaml

from tests.conftest import LIGHT_JOB

CONTRACT = {
    "nccl_burst": ({"burst_ms", "queued_op_us", "op_us_mean", "op_us_p50", "op_us_p99",
                    "algbw_gbps", "busbw_gbps"}, None),
    "allreduce_sweep": ({"time_us", "algbw_gbps", "busbw_gbps"}, [8, 16, 32]),
    "all_to_all": ({"a2a_us", "a2a_us_per_token", "busbw_gbps"}, [1, 2, 4]),
}


def artifact_paths(client, run_id, path=""):
    out = []
    for a in client.list_artifacts(run_id, path):
        out += artifact_paths(client, run_id, a.path) if a.is_dir else [a.path]
    return out


def test_each_experiment_logs_its_contract(k25):
    # one multirun over the three experiments (one process: a job per experiment)
    # torch's communicator: vLLM's is tested where it is the subject (test_collective_runners,
    # the campaign), and importing vLLM costs each rank ~10 s of CPU
    r = k25("-m", f"experiment={','.join(CONTRACT)}", "debug=quick",
            "experiment.communicator=choice(torch)")  # a sweep: set in each job's own experiment
    assert r.returncode == 0, r.stderr[-3000:]
    # one parent for the multirun, a child per job, each with its own job's resolved config
    (parent,) = [x for x in r.runs() if x.data.tags.get("k25exp.role") == "parent"]
    runs = [x for x in r.runs() if x.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(r.runs()) == 4 and len(runs) == 3
    assert parent.info.status == "FINISHED"
    assert parent.data.metrics == {"children": 3.0, "failed_children": 0.0}
    assert sorted(x.data.params["experiment.name"] for x in runs) == sorted(CONTRACT)
    c = r.client
    for run in runs:
        name = run.data.params["experiment.name"]
        metrics, steps = CONTRACT[name]
        assert run.info.status == "FINISHED"
        assert metrics <= set(run.data.metrics), (name, sorted(run.data.metrics))
        if steps:
            hist = c.get_metric_history(run.info.run_id, next(iter(metrics)))
            assert sorted(m.step for m in hist) == steps
        exp = c.get_experiment(run.info.experiment_id)
        assert exp.name == f"k25exp/{name}"
        assert exp.artifact_location.startswith(str(r.outputs / "mlartifacts"))


def test_single_run_records_params_tags_and_artifacts(k25):
    r = k25("experiment=nccl_burst", "debug=quick", "experiment.reference_tpot_ms=12.5",
            "experiment.communicator=torch")
    assert r.returncode == 0, r.stderr[-3000:]
    (run,) = r.runs()
    p, t, m = run.data.params, run.data.tags, run.data.metrics
    assert p["model.hidden_size"] == "7168" and p["experiment.message_bytes"] == "14336"
    assert p["experiment.ops_per_step"] == "null" and p["hardware.backend"] == "gloo"
    assert m["ops_per_step"] == 124 and p["experiment.communicator"] == "torch"
    assert m["decode_share"] == pytest.approx(100 * m["burst_ms"] / 12.5)  # percent of TPOT
    for key in ("git_commit", "host", "torch", "device_names", "world_size", "gloo_version",
                "hydra.overrides", "timing.timer", "timing.queued", "timing.blocking"):
        assert t.get(key), key
    assert "experiment.reference_tpot_ms=12.5" in t["hydra.overrides"]
    arts = set(artifact_paths(r.client, run.info.run_id))
    assert {"config.resolved.yaml", "raw/rank0.jsonl", "raw/rank1.jsonl", "raw/spec.json",
            "results.csv", "results.txt", "plots/op_latency_hist.png", ".hydra/overrides.yaml"} <= arts
    local = r.client.download_artifacts(run.info.run_id, "config.resolved.yaml")
    resolved = yaml.safe_load(open(local))
    assert resolved["experiment"]["message_bytes"] == 14336  # resolved, not ${...}
    assert "124 ops per step (step collectives)" in r.stdout  # the table is printed


def test_dead_rank_fails_its_job_keeps_samples_and_the_sweep_goes_on(k25):
    r = k25("-m", "experiment=allreduce_sweep", "debug=quick", "experiment.fault.at_point=2", "experiment.communicator=torch",
            "experiment.fault.kill_rank=1,null")
    assert r.returncode == 1
    runs = r.runs()
    (parent,) = [x for x in runs if x.data.tags.get("k25exp.role") == "parent"]
    failed = [x for x in runs if x.info.status == "FAILED" and x is not parent]
    finished = [x for x in runs if x.info.status == "FINISHED"]
    assert len(failed) == 1 and len(finished) == 1
    f = failed[0]
    assert "rank 1 died at point 2" in f.data.tags["error"]
    assert sorted(m.step for m in r.client.get_metric_history(f.info.run_id, "time_us")) == [8, 16]
    arts = set(artifact_paths(r.client, f.info.run_id))
    assert {"raw/rank0.jsonl", "raw/rank1.jsonl", "results.csv", "error.txt"} <= arts
    assert sorted(m.step for m in r.client.get_metric_history(finished[0].info.run_id, "time_us")) == [8, 16, 32]
    assert parent.info.status == "FAILED"
    assert parent.data.metrics["failed_children"] == 1.0 and parent.data.metrics["children"] == 2.0
    assert "1 job(s) failed" in r.stderr


def test_config_error_in_a_sweep_is_a_failed_child(k25):
    r = k25("-m", *LIGHT_JOB, "experiment.calls=0,2")
    assert r.returncode == 1
    runs = r.runs()
    bad = [x for x in runs if x.data.tags.get("error_type") == "ConfigError"]
    assert len(bad) == 1 and "experiment.calls=0: expected a positive number" in bad[0].data.tags["error"]
    assert bad[0].info.status == "FAILED" and bad[0].data.tags.get("mlflow.parentRunId")
    assert sum(x.info.status == "FINISHED" for x in runs) == 1


def test_tracking_none_writes_no_store(k25):
    r = k25(*LIGHT_JOB, "tracking=none")
    assert r.returncode == 0, r.stderr[-3000:]
    assert not (r.outputs / "mlflow.db").exists()
    assert list(r.outputs.glob("runs/*/*/results.csv"))


def test_the_job_config_is_resolved_and_its_secrets_found_once(monkeypatch):
    """JobConfig.of walks the resolved config for secrets once; the resolved config, the
    overrides and the run name it hands the writers are masked already."""
    from k25exp import redact
    from k25exp.job import JobConfig
    from tests.conftest import compose_cfg

    walks = []
    real = redact.secret_values
    monkeypatch.setattr(redact, "secret_values", lambda *a: walks.append(1) or real(*a))
    overrides = ["experiment=nccl_burst", "+hardware.env.HF_TOKEN=hf_abc123",
                 "+hardware.env.PLAIN=plain-v", "tracking.redact=[PLAIN]", "+experiment.note=x-hf_abc123"]
    job = JobConfig.of(compose_cfg(*overrides), overrides)
    assert len(walks) == 1
    text = str(job.resolved) + " ".join(job.overrides) + job.run_name
    assert "hf_abc123" not in text and "plain-v" not in text
    assert job.resolved["hardware"]["env"]["HF_TOKEN"] == redact.MARK
    assert job.resolved["experiment"]["note"] == f"x-{redact.MARK}"  # found by value elsewhere
    assert job.run_name.startswith("nccl_burst +hardware.env.HF_TOKEN=***redacted***")
    assert job.redact("failed with hf_abc123") == f"failed with {redact.MARK}"
