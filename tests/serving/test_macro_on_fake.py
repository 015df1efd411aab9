"""The macro runner's safe defaults, against the fake vLLM server (no model) launched through
the real launch code: the prefix-cache reset only when asked (and the tag says what happened),
dev mode off on a network bind, requests.jsonl closed and flushed when a run fails midway."""

from __future__ import annotations

import orjson
import psutil
import pytest

from k25exp.config.validate import to_typed
from k25exp.runners import runner_for
from k25exp.serving import server
from k25exp.serving.errors import BadAnswer
from k25exp.tracking import MemoryRecorder
from tests.conftest import compose_cfg
from tests.serving.helpers import fake_marks, fake_model, fake_overrides, orphans

pytestmark = pytest.mark.fake_server  # one xdist worker runs every server test, in order

SMALL = ["experiment.input_tokens=16", "experiment.output_tokens=4", "experiment.concurrency=[1,2]",
         "experiment.single_stream_requests=2", "experiment.warmup=1", "experiment.rounds=1",
         "experiment.min_requests=2", "experiment.progress=false"]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    model = fake_model(tmp_path_factory.mktemp("fake_model"))
    yield model
    server.stop_all()
    assert not orphans(marks=fake_marks(model))


def run_macro(out, *overrides):
    # a test's own overrides after SMALL: they win (before, SMALL's output_tokens=4 silently
    # replaced a test's experiment.output_tokens=8)
    cfg = to_typed(compose_cfg(*SMALL, *overrides, f"paths.outputs={out}"), gpu_count=lambda: 0)
    rec = MemoryRecorder()
    return cfg, rec, runner_for(cfg.experiment)(cfg, out, rec)


def test_prefix_cache_reset_only_when_asked_and_the_tag_says_so(model, tmp_path):
    _, rec, summary = run_macro(tmp_path / "on", *fake_overrides(model, tmp_path))
    assert rec.tags["prefix_cache"] == "reset before every level"
    assert summary["peak_output_tok_s"] > 0 and rec.latest("completed") == {1: 2, 2: 2}
    assert rec.latest("server_requests") == {1: 2, 2: 2}  # the fake's /metrics, parsed
    _, rec, _ = run_macro(tmp_path / "off", *fake_overrides(model, tmp_path),
                          "experiment.reset_prefix_cache=false")
    assert rec.tags["prefix_cache"] == "not reset (experiment.reset_prefix_cache=false)"


def test_network_bind_without_reset_runs_with_dev_mode_off(model, tmp_path):
    cfg, rec, _ = run_macro(tmp_path, *fake_overrides(model, tmp_path), "server.host=0.0.0.0",
                            "experiment.reset_prefix_cache=false")
    srv = server.running()[0]
    assert srv.spec.host == "0.0.0.0" and "VLLM_SERVER_DEV_MODE" not in srv.spec.env
    assert "dev mode off" in srv.log_path.read_text()  # what the child saw
    assert rec.latest("completed") == {1: 2, 2: 2}


def test_requests_jsonl_is_closed_and_flushed_when_the_run_fails(model, tmp_path):
    """A proxy's HTML page for /metrics fails the run after the warm-up: a clear error naming
    the URL, and the warm-up's record on disk in a closed file."""
    out = tmp_path / "out"
    with pytest.raises(BadAnswer, match=r"GET http://127.0.0.1:\d+/metrics: expected Prometheus "
                       r"text, got HTTP 200, content-type text/html: '<html>"):
        run_macro(out, *fake_overrides(model, tmp_path, "FAKE_VLLM_METRICS=html"))
    jsonl = out / "requests.jsonl"
    assert [line.count(b'"phase":"warmup"') for line in jsonl.read_bytes().splitlines()] == [1]
    assert str(jsonl) not in {f.path for f in psutil.Process().open_files()}


def test_a_healthy_run_is_flagged_valid_with_tpot_equal_to_the_servers_pace(model, tmp_path):
    """A server whose pace is known (the fake: one token every 25 ms, nothing held back):
    every phase is valid unless it found a delivery stall (a machine too busy to read the
    stream in time does make one: then that, and only that, is why), and TPOT is at least that
    pace. The client-lag limit is lifted (the absolute rule's): how late a loaded machine wakes
    the client is its scheduler's. A bug that flagged every level invalid fails here, not as a
    skipped check."""
    _, rec, summary = run_macro(tmp_path, *fake_overrides(model, tmp_path, "FAKE_VLLM_GAP_MS=25"),
                                "experiment.output_tokens=8", "experiment.validity.rule=absolute",
                                "experiment.max_client_lag_ms=1e9")
    stalls = rec.latest("delivery_stalls")
    assert sorted(stalls) == [1, 2]
    assert rec.latest("valid") == {c: float(stalls[c] == 0) for c in (1, 2)}
    if summary.get("single_stream_delivery_stalls", 0) == 0:
        assert summary["single_stream_valid"] == 1.0
    for c, tpot in rec.latest("tpot_ms_p50").items():
        assert tpot >= 24.0, c  # the fake's gap (the client cannot read faster than it writes)


def test_each_level_is_judged_against_its_own_step_and_the_run_names_the_rule(model, tmp_path):
    """The default rule (relative): each level's lag limit is half its own ITL mean (the fake's
    25 ms pace, or slower on a loaded machine), logged beside it; the run's tag names the rule."""
    _, rec, _ = run_macro(tmp_path, *fake_overrides(model, tmp_path, "FAKE_VLLM_GAP_MS=25"))
    assert rec.tags["macro.validity"].startswith("relative: a send late by >= 0.5 x the level's ITL mean")
    itl, ref, limit = (rec.latest(k) for k in ("itl_ms_mean", "client_lag_ref_ms", "client_lag_limit_ms"))
    assert sorted(ref) == [1, 2]
    for c in (1, 2):
        assert ref[c] == itl[c] >= 24.0 and limit[c] == pytest.approx(ref[c] / 2), c
        late = rec.latest("client_late_sends")[c]
        # 2 sends a level (SMALL): lagged only when both were late (1 is allowed)
        assert rec.latest("client_lagged")[c] == float(late >= 2 or rec.latest("client_cpu_util")[c] > 0.9
                                                       or rec.latest("client_loop_lag_ms_mean")[c] >= limit[c])


def test_repeats_pool_every_request_and_log_the_spread(model, tmp_path):
    """experiment.repeats=3 at c=2, 2 requests a repeat: 6 requests behind each level's
    figures, each repeat's own prompts, and the spread of the repeats' medians."""
    out = tmp_path / "out"
    _, rec, _ = run_macro(out, *fake_overrides(model, tmp_path, "FAKE_VLLM_GAP_MS=10"),
                          "experiment.repeats=3")  # levels 1 and 2, 2 requests each (SMALL)
    import orjson

    recs = [orjson.loads(x) for x in (out / "requests.jsonl").read_bytes().splitlines()]
    sweep = [r for r in recs if r["phase"] == "sweep" and r["level"] == 2]
    assert sorted(r["repeat"] for r in sweep) == [0, 0, 1, 1, 2, 2]
    assert len({r["prompt_index"] for r in sweep}) == 6  # fresh prompts for every repeat
    assert rec.latest("repeats") == {1: 3.0, 2: 3.0} and rec.latest("completed") == {1: 6, 2: 6}
    assert rec.latest("tpot_ms_n") == {1: 6, 2: 6}  # pooled: every request of every repeat
    assert rec.latest("server_requests") == {1: 6, 2: 6}  # one scrape before, one after all three
    # each repeat's median TPOT by hand (2 requests: the mean of the two), then their spread
    per_rep = sorted(sum(r["tpot_s"] for r in sweep if r["repeat"] == k) / 2 * 1e3 for k in range(3))
    assert rec.latest("tpot_ms_p50_rep_min")[2] == pytest.approx(per_rep[0])
    assert rec.latest("tpot_ms_p50_rep_max")[2] == pytest.approx(per_rep[2])
    assert rec.latest("tpot_ms_p50_rep_spread_pct")[2] == pytest.approx(
        (per_rep[2] - per_rep[0]) / per_rep[1] * 100)
    assert 5 < per_rep[0]  # the fake's 10 ms gap: no faster (slower is the machine's)


def test_an_uncapped_open_loop_names_the_clients_cap_and_queues_there(model, tmp_path, monkeypatch):
    """An open loop without max_concurrency is still capped by the client (a socket per
    request in flight): the tag names that cap, and requests over it wait in the client's
    queue (queue_ms), measured, not inside the HTTP library's pool, where the wait would land
    in their TTFT. The cap is lowered to 2 here; 6 requests are due within ~5 ms, each served
    in ~90 ms (60 ms to the first token, then 3 more 10 ms apart)."""
    from k25exp.config.experiments import serving

    monkeypatch.setattr(serving, "OPEN_LOOP_CAP", 2)  # the tag reads the same cap
    _, rec, _ = run_macro(tmp_path, *fake_overrides(model, tmp_path, "FAKE_VLLM_TTFT_MS=60",
                                                    "FAKE_VLLM_GAP_MS=10"),
                          "experiment.load=open", "experiment.request_rate=[1000,20]",
                          "experiment.burstiness=1000", "experiment.limit_points=1",
                          "experiment.requests=6", "experiment.reset_prefix_cache=false")
    load = rec.tags["macro.load"]
    assert load.startswith("open loop: gamma arrivals (burstiness 1000; 1 = Poisson) at [1000.0] req/s")
    assert "at most 2 in flight (the client's cap; max_concurrency unset)" in load
    assert "closed" not in rec.tags["macro.client"]
    sweep = sorted((orjson.loads(x) for x in (tmp_path / "requests.jsonl").read_bytes().splitlines()
                    if b'"phase":"sweep"' in x), key=lambda r: r["sent_s"])
    assert len(sweep) == 6 and all(r["ok"] for r in sweep)
    # two at a time: the last two waited about two services for a slot ...
    assert sweep[-1]["queue_ms"] > 120 and sweep[0]["queue_ms"] < 20
    # ... and not one of them waited after it was sent: TTFT counts from the actual send
    # (at least the server's 60 ms), the slot's wait only in the scheduled figure
    assert min(r["ttft_s"] for r in sweep) >= 0.06
    assert all(r["ttft_sched_s"] >= r["ttft_s"] + r["queue_ms"] / 1e3 - 1e-6 for r in sweep)
    assert rec.latest("target_rate_req_s") == {1000000: 1000.0}  # the limited sweep: one level


def test_levels_sent_by_several_client_processes_merge_into_one_record_and_figure_set(model, tmp_path):
    """experiment.client_processes=3 against the fake's step engine (one token to every stream
    every 20 ms): the warm-up and single stream (one stream each) go from this process, each
    level and its warm-up round from min(3, C) processes; requests.jsonl holds every request of a level once, each
    naming its process, and the logged figures are the hand counts of those records."""
    out = tmp_path / "out"
    _, rec, _ = run_macro(out, *fake_overrides(model, tmp_path, "FAKE_VLLM_STEP_MS=20"),
                          "experiment.client_processes=3", "experiment.concurrency=[2,6]",
                          "experiment.requests=12", "experiment.output_tokens=6")
    assert rec.latest("client_processes") == {2: 2.0, 6: 3.0}
    assert rec.latest("client_failures") == {2: 0.0, 6: 0.0}
    assert "3 client process(es) per level" in rec.tags["macro.client"]
    assert "sockets: asyncio protocol (k25exp.load.sockets)" in rec.tags["macro.client"]
    recs = [orjson.loads(x) for x in (out / "requests.jsonl").read_bytes().splitlines()]
    # the job's warm-up and the single stream (one stream each) from this process
    assert {r["shard"] for r in recs if r["phase"] != "sweep" and r["level"] == 1} == {0}
    for c, procs in ((2, 2), (6, 3)):
        # the level's warm-up round (experiment.level_warmup) is sent as the level is
        warm = [r for r in recs if r["phase"] == "warmup" and r["level"] == c]
        assert len(warm) == c and {r["shard"] for r in warm} == set(range(procs))
        lvl = [r for r in recs if r["phase"] == "sweep" and r["level"] == c]
        assert sorted(r["i"] for r in lvl) == list(range(12)) and all(r["ok"] for r in lvl)
        assert {r["shard"] for r in lvl} == set(range(procs))
        assert sorted({r["worker"] for r in lvl}) == list(range(c))
        tokens = sum(r["usage"]["completion_tokens"] for r in lvl)
        wall = rec.latest("wall_s")[c]
        assert tokens == 72 and rec.latest("output_tok_s")[c] == pytest.approx(tokens / wall)
        tpot = sorted((r["chunk_s"][-1] - r["chunk_s"][0]) / 5 for r in lvl)
        assert rec.latest("tpot_ms_p50")[c] == pytest.approx((tpot[5] + tpot[6]) / 2 * 1e3)
        assert rec.latest("tpot_ms_p50")[c] > 10.0  # the fake's 20 ms step: no faster
        ttft = sorted(r["chunk_s"][0] for r in lvl)
        assert rec.latest("ttft_ms_p50")[c] == pytest.approx((ttft[5] + ttft[6]) / 2 * 1e3)
        lags = [r["lag_ms"] for r in lvl]
        assert rec.latest("client_lag_ms_max")[c] == pytest.approx(max(lags))
        lo, hi = rec.latest("output_tok_s_ci_lo")[c], rec.latest("output_tok_s_ci_hi")[c]
        assert lo < tokens / wall < hi  # when tokens arrived varies over a level: a width


def test_a_duration_limited_level_over_client_processes_builds_its_prompts_there(model, tmp_path):
    """With experiment.duration_s no one knows how many prompts a level needs: each client
    process gets the prompt builder (the tokenizer with it) and builds prompt i itself, from
    the one shared counter: every index once, from both processes. The window holds what was
    *due* in it: every request due in the first second is sent (however late a busy machine
    makes the client: that is its lag_ms), none due after it is, each worker's chain of
    requests is unbroken, and nothing here bounds the wall clock."""
    out = tmp_path / "out"
    _, rec, _ = run_macro(out, *fake_overrides(model, tmp_path, "FAKE_VLLM_STEP_MS=10"),
                          "experiment.client_processes=2", "experiment.concurrency=[4]",
                          "experiment.duration_s=1.0", "experiment.output_tokens=6")
    recs = [orjson.loads(x) for x in (out / "requests.jsonl").read_bytes().splitlines()]
    sweep = [r for r in recs if r["phase"] == "sweep"]
    # 4 streams of ~6 steps of 10 ms for 1 s: dozens of requests on an idle machine, at least
    # each worker's first (due at the start) on any; none lost, none twice
    assert len(sweep) >= 4 and sorted(r["i"] for r in sweep) == list(range(len(sweep)))
    assert {r["shard"] for r in sweep} == {0, 1} and all(r["ok"] for r in sweep)
    start = min(r["scheduled_s"] for r in sweep)  # ramp 0: every worker's first is due at start
    for w in range(4):  # each worker's chain, by hand: the next is due when the last one ended
        mine = sorted((r for r in sweep if r["worker"] == w), key=lambda r: r["scheduled_s"])
        assert mine[0]["scheduled_s"] == start
        for a, b in zip(mine, mine[1:]):
            assert b["scheduled_s"] == pytest.approx(a["sent_s"] + a["end_s"], abs=1e-9)
        assert all(r["scheduled_s"] - start < 1.0 for r in mine)  # due inside: sent
        assert mine[-1]["sent_s"] + mine[-1]["end_s"] - start >= 1.0  # the next was due outside
    for r in sweep:  # lateness is reported, not hidden: lag = sent − due
        assert r["lag_ms"] == pytest.approx((r["sent_s"] - r["scheduled_s"]) * 1e3, abs=1e-6)
    assert rec.latest("client_lag_ms_max") == {4: pytest.approx(max(r["lag_ms"] for r in sweep))}
    assert rec.latest("client_processes") == {4: 2.0} and rec.latest("completed") == {4: len(sweep)}
