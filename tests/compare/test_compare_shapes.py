"""`k25exp compare` between macro runs of each load shape, end to end: jobs against the fake
vLLM server (real launch code, real client, a real MLflow store in tmp), then the compare CLI.

Runs (three multiruns, one fake server start each, every run twice with the same settings):
two trace replays at speedups 1 and 2, two sessions runs at 1 and 2 sessions in flight, and a
closed loop with fixed prompt lengths against one with a uniform distribution.
"""

from __future__ import annotations

import pytest

from tests.compare.test_compare_cli import compare, row
from tests.conftest import make_k25
from tests.serving.helpers import FAKE_ENTRYPOINT, fake_marks, fake_model, orphans

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600), pytest.mark.xdist_group("compare_shapes")]

COMMON = [FAKE_ENTRYPOINT, "server.port=0", "server.ready_timeout_s=30", "server.stop_timeout_s=5",
          "server.tp=1", "experiment.input_tokens=16", "experiment.output_tokens=4",
          "experiment.single_stream_requests=0", "experiment.warmup=1", "experiment.progress=false",
          "experiment.reset_prefix_cache=false",
          # this test is about the comparison, not the client's health on a loaded machine
          "experiment.validity.rule=absolute", "experiment.max_client_lag_ms=1e9",
          "experiment.stall_min_chunks=100"]
TRACE_LINES = 12
SESSIONS = 6  # a level's sessions, of 2 turns each


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("compare_shapes")
    k25 = make_k25(tmp)
    model = fake_model(tmp / "model")
    common = ["experiment=macro", *COMMON, f"server.model_path={model}", f"server.log_dir={tmp}"]
    trace = tmp / "trace.jsonl"
    trace.write_text("".join(f'{{"timestamp": {40 * k}, "input_length": 16, "output_length": 4}}\n'
                             for k in range(TRACE_LINES)))
    jobs = {
        "trace": ["experiment.load=trace", f"experiment.trace.path={trace}",
                  "experiment.trace.speedup=[1,2]", "+server.env.FAKE_VLLM_GAP_MS=10,10"],
        "sessions": ["experiment.load=sessions", "experiment.concurrency=[1,2]",
                     f"experiment.sessions.count={SESSIONS}", "experiment.sessions.turns=2",
                     "+server.env.FAKE_VLLM_GAP_MS=10,10"],
        "shapes": ["experiment.concurrency=[2]", "experiment.requests=12", "+server.env.FAKE_VLLM_GAP_MS=10",
                   "experiment.input_len.range_ratio=0.5", "experiment.input_len.dist=fixed,uniform"]}
    ids: dict[str, list[str]] = {}
    seen: set[str] = set()
    for name, args in jobs.items():
        p = k25("-m", *common, *args)
        assert p.returncode == 0, p.stderr[-3000:]
        runs = [r for r in p.runs() if r.info.run_id not in seen]
        seen |= {r.info.run_id for r in runs}
        runs = [r for r in runs if r.data.tags.get("k25exp.role") != "parent"
                and r.data.tags.get("k25exp.experiment") == "macro"]
        assert len(runs) == 2, [r.data.tags for r in runs]
        ids[name] = [r.info.run_id for r in runs]
        uri = p.uri
    assert not orphans(marks=fake_marks(model))
    return uri, tmp, ids


def test_two_trace_replays_compare_level_by_speedup(store):
    uri, tmp, ids = store
    p, rows, _ = compare(uri, tmp, *ids["trace"], "--no-track", subprocess_cli=False)
    assert p.returncode == 0, p.stderr[-2000:]
    assert rows["shape_diff"] == []  # one trace, one shape
    for step in (1000, 2000):  # speedup × 1000, each level's requests the trace's lines
        for metric in ("ttft_ms_p50", "tpot_ms_p50", "ttft_sched_ms_p50", "e2e_sched_ms_mean"):
            r = row(rows, metric, step)
            assert r["n"] == [TRACE_LINES, TRACE_LINES] and r["p"] is not None, r
    assert row(rows, "scheduled_rate_req_s", 2000)["note"].startswith("no samples")


def test_two_sessions_runs_compare_each_turn_per_concurrency(store):
    uri, tmp, ids = store
    p, rows, _ = compare(uri, tmp, *ids["sessions"], "--no-track", subprocess_cli=False)
    assert p.returncode == 0, p.stderr[-2000:]
    assert rows["shape_diff"] == []
    for c in (1, 2):
        for turn in (1, 2):  # each turn's TTFT, its samples that turn's requests: one a session
            r = row(rows, f"turn{turn}_ttft_ms_p50", c)
            assert r["n"] == [SESSIONS, SESSIONS] and r["better"] == "lower", r
        assert row(rows, "ttft_ms_p50", c)["n"] == [2 * SESSIONS, 2 * SESSIONS]  # every turn
        assert row(rows, "sessions_completed", c)["a"] == SESSIONS


def test_runs_with_different_request_shapes_are_compared_with_a_warning(store):
    uri, tmp, ids = store
    fixed, uniform = ids["shapes"]
    p, rows, out = compare(uri, tmp, fixed, uniform, "--no-track")
    assert p.returncode == 0, p.stderr[-2000:]
    (note,) = rows["shape_diff"]
    assert note.startswith("the requests differ (macro): input lengths: A `fixed 16`, B `uniform, mean 16, "
                           "range_ratio 0.5, clipped to [1, none]`")
    assert "WARNING: the requests differ" in p.stdout
    assert "> **Warning:** the requests differ" in (out / "compare.md").read_text()
    # and the figures still: every level's shape, its samples the 12 requests each
    assert row(rows, "input_len_std", 2)["a"] == 0 and row(rows, "input_len_std", 2)["b"] > 0
    assert row(rows, "tpot_ms_p50", 2)["n"] == [12, 12]
    # a sessions run against a closed loop at the same concurrency: the load is named
    p, rows, _ = compare(uri, tmp, fixed, ids["sessions"][0], "--no-track", subprocess_cli=False)
    (note,) = rows["shape_diff"]
    assert "load: A `closed`, B `sessions`" in note and "sessions: A `(none)`, B `2 turns a session" in note
