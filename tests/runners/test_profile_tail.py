"""experiment=profile's ITL tail by cause (k25exp.runners.profile_tail) end to end against the
fake vLLM server program playing an engine (tests/serving/engine_stub.py, launched through
k25exp's real launch code): it writes its steps as a trace on /stop_profile, one step of the
profiled level is injected 150 ms long, and the run logs the tail, the clock and its files."""

from __future__ import annotations

import csv
import json

import pytest

from k25exp.config.validate import to_typed
from k25exp.runners import runner_for
from k25exp.serving import server
from k25exp.tracking import MemoryRecorder
from tests.conftest import compose_cfg
from tests.serving.helpers import fake_marks, fake_model, fake_overrides, orphans

pytestmark = [pytest.mark.fake_server, pytest.mark.e2e]

C, OUT = 4, 40  # the profiled level: 4 requests of 40 tokens at once: 156 gaps (a p99 needs 100)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    model = fake_model(tmp_path_factory.mktemp("fake_model"))
    yield model
    server.stop_all()
    assert not orphans(marks=fake_marks(model))


def test_the_profiled_tail_is_joined_to_the_steps_and_logged(model, tmp_path):
    out = tmp_path / "run"
    # the profiled window's 10th step (its requests' 10th token or so) lasts 150 ms more
    env = ["FAKE_VLLM_ENGINE=1", "FAKE_VLLM_STEP_MS=20", "VLLM_SERVER_DEV_MODE=1",
           "FAKE_VLLM_INJECT='" + json.dumps({"10": {"slow_ms": 150}}) + "'"]
    overrides = [o for o in fake_overrides(model, tmp_path, *env) if o != "experiment=macro"]
    cfg = to_typed(compose_cfg("experiment=profile", *overrides, f"paths.outputs={tmp_path}",
                               f"experiment.concurrency={C}", f"experiment.requests={C}",
                               f"experiment.output_tokens={OUT}", "experiment.input_tokens=16",
                               "experiment.warmup=1", "experiment.reference_rounds=0",
                               "experiment.server_burst_reps=0"), gpu_count=lambda: 0)
    rec = MemoryRecorder()
    summary = runner_for(cfg.experiment)(cfg, out, rec)
    m = {k: v for k, v, _ in rec.metrics}
    # every gap of the level, its tail above the p99 of 156 gaps: the 150 ms step's tokens
    assert m["tail.itl_n"] == C * (OUT - 1) and m["tail.itl_ms_p99"] > 0
    assert m["tail.gaps"] >= 1 and m["tail.cause.long_step_gaps"] == m["tail.gaps"]
    assert m["tail.caused_pct"] >= 95 and summary["tail.caused_pct"] == m["tail.caused_pct"]
    assert m["tail.batch_match_pct"] == 100
    # one host, one system clock: the causality bracket holds 0, nothing shifted
    assert m["clock.lo_ms"] <= 0 <= m["clock.hi_ms"] and m["clock.shift_ms"] == 0
    assert m["clock.lower_n"] == C * OUT
    # the client-only decomposition of the same tail: an engine-wide pause
    assert m["tail_client.cause.engine_gaps"] == m["tail_client.gaps"] >= 1
    assert m["tail_client.agree_pct"] == 100
    for f in ("causes.txt", "causes.csv", "tail_gaps.csv", "token_gaps.csv.gz", "steps.csv",
              "timeline.png", "worst.txt", "clock.json"):
        assert (out / "tail" / f).stat().st_size > 0, f
    # what grew in the slow step: the stub's one operator (aten::mm), 150 ms over the median
    rows = list(csv.DictReader(open(out / "tail" / "tail_gaps.csv")))
    assert rows and all(r["step_grew"].startswith("gemm_dense +15") for r in rows), rows[0]
    # the same from `k25exp analyze TRACE --tail RUN --out DIR` (the breakdown it writes to DIR)
    from k25exp.commands.analyze import main as analyze_main

    assert analyze_main([str(out / "traces"), "--tail", str(out), "--json",
                         "--out", str(tmp_path / "again")]) == 0
    again = list(csv.DictReader(open(tmp_path / "again" / "tail" / "tail_gaps.csv")))
    assert [r["step_grew"] for r in again] == [r["step_grew"] for r in rows]
    clock = json.loads((out / "clock.json").read_text())
    assert clock["wall_t1_ns"] > clock["wall_t0_ns"]
    assert "inferred" in rec.tags["tail.note"]
