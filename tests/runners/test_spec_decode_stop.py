"""experiment=spec_decode stopped part-way (Ctrl-C, or a GPU stage's time limit, which sends
SIGINT): the points it measured are kept. The servers are the fake vLLM server
(tests/serving/fake_vllm_server.py: no model, no speculative decoding, no acceptance counters)
launched through the real launch code: what is tested is what the runner keeps when it is
stopped, which needs two server settings and a signal, not what vLLM computes
(tests/runners/test_spec_decode.py runs the real CPU build)."""

from __future__ import annotations

import csv
import signal
import subprocess
import sys

import orjson
import pytest

from k25exp.poll import wait_until
from tests.conftest import ROOT, CliResult, job_env, seed_store
from tests.serving.helpers import fake_marks, fake_model, fake_overrides, orphans

pytestmark = pytest.mark.fake_server  # one xdist worker runs every server test, in order

OUT_TOKENS = 150  # at 40 ms a token a request takes 6 s: a level outlasts the test's reaction


def _tpot_ms(rec: dict) -> float:
    """vLLM's TPOT of one request, by hand from its chunk times."""
    return (rec["chunk_s"][-1] - rec["chunk_s"][0]) / (rec["usage"]["completion_tokens"] - 1) * 1e3


def _sweep(path, level: int) -> list[dict]:
    recs = [orjson.loads(x) for x in path.read_bytes().splitlines()]
    return [r for r in recs if r["phase"] == "sweep" and r["level"] == level]


def test_a_job_stopped_in_its_baseline_keeps_every_point_measured(tmp_path):
    """The speculative server measured at c = 1 and 2, then the baseline at c = 1; SIGINT
    while the baseline's c = 2 level runs. The run ends KILLED, and holds points.csv, the
    table and the point metrics: the speedup at c = 1 (paired), the speculative TPOT alone
    at c = 2 (its baseline never finished). Before, the points were written only at the end
    of the job, and a GPU stage cut by its limit kept none of its per-α acceptance figures."""
    model = fake_model(tmp_path / "model")
    outputs = tmp_path / "outputs"
    seed_store(outputs)
    args = [a for a in fake_overrides(model, tmp_path / "logs", "FAKE_VLLM_GAP_MS=40")
            if a != "experiment=macro"]
    p = subprocess.Popen(
        [sys.executable, "-m", "k25exp", "experiment=spec_decode", *args, "spec=ngram",
         "experiment.acceptance=as_model", "experiment.baseline_sync=false",
         "experiment.concurrency=[1,2]", "experiment.rounds=1", "experiment.min_requests=1",
         "experiment.single_stream_requests=0", "experiment.warmup=0",
         "experiment.level_warmup=false", "experiment.input_tokens=16",
         f"experiment.output_tokens={OUT_TOKENS}", "experiment.progress=false",
         f"paths.outputs={outputs}"],
        cwd=ROOT, env=job_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        # a background job inherits SIGINT ignored; give the child the terminal's default
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        def baseline_level_1_done() -> bool:
            assert p.poll() is None, p.stdout.read().decode()[-3000:]
            return any(_sweep(f, 1) for f in outputs.glob("runs/*/*/baseline/requests.jsonl"))

        wait_until(baseline_level_1_done, 300, 0.1, "the baseline's level 1")
        p.send_signal(signal.SIGINT)
        log = p.communicate(timeout=120)[0].decode()
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode != 0, log[-3000:]
    assert "the points measured so far are in points.csv" in log

    (folder,) = [f.parent.parent for f in outputs.glob("runs/*/*/baseline/requests.jsonl")]
    with open(folder / "points.csv") as f:
        rows = list(csv.DictReader(f))
    assert sorted((r["server"], int(r["level"])) for r in rows) == [
        ("baseline", 1), ("spec", 1), ("spec", 2)]
    # by hand from the requests (one request a level: its TPOT is the level's p50)
    (spec1,), (base1,) = _sweep(folder / "spec/requests.jsonl", 1), _sweep(folder / "baseline/requests.jsonl", 1)
    spec2 = _sweep(folder / "spec/requests.jsonl", 2)
    assert len(spec2) == 2

    res = CliResult(p.returncode, log, "", outputs, f"sqlite:///{outputs}/mlflow.db")
    (run,) = res.runs()
    assert run.info.status == "KILLED"
    hist = {name: {m.step: m.value for m in res.client.get_metric_history(run.info.run_id, name)}
            for name in ("model/speedup_med", "model/spec_tpot_ms_med", "model/base_tpot_ms_med")}
    assert hist["model/speedup_med"] == {1: pytest.approx(_tpot_ms(base1) / _tpot_ms(spec1))}
    assert hist["model/spec_tpot_ms_med"][1] == pytest.approx(_tpot_ms(spec1))
    assert 2 in hist["model/spec_tpot_ms_med"] and 2 not in hist["model/base_tpot_ms_med"]
    arts = {a.path for a in res.client.list_artifacts(run.info.run_id)}
    assert {"points.csv", "results.txt"} <= arts
    assert not orphans(marks=fake_marks(model)), "server processes survived the stop"
