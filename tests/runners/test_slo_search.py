"""experiment=slo_search: the search on a known threshold (synthetic probes), and end to end
against the fake vLLM server held to one request at a time, whose latency from the
scheduled send grows with the rate in a known way."""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from k25exp.config.validate import ConfigError, to_typed
from k25exp.runners import runner_for
from k25exp.runners.slo_search import NoLoadMeetsSlo, Search, answer, verdict
from k25exp.load.level_figures import level_figures
from k25exp.serving import server
from k25exp.stats import percentile
from k25exp.tracking import MemoryRecorder
from tests.conftest import compose_cfg
from tests.serving.helpers import fake_marks, fake_model, fake_overrides, orphans


SLO = "experiment.slo.ttft_ms=500"


def _search(threshold, **kw):
    exp = to_typed(compose_cfg("experiment=slo_search", SLO, *[f"experiment.{k}={v}" for k, v in kw.items()]),
                   gpu_count=lambda: 0).experiment
    s, history = Search(exp), []
    while (x := s.next(history)) is not None:
        history.append((x, x <= threshold))
    return history


def test_bracketing_then_bisection_finds_a_known_threshold():
    h = _search(5.3)  # start 1: 1 2 4 8 (fails), then 6 (fails), 5, 5.5 (fails): 5 and 5.5 within 10 %
    assert [x for x, _ in h] == [1, 2, 4, 8, 6, 5, 5.5]
    best = max(x for x, m in h if m)
    assert best == 5 and (5.5 - best) / best <= 0.1
    h = _search(0.3)  # halving from 1: 0.5 (fails), 0.25 (meets), then bisection up to 10 %
    assert [x for x, _ in h] == [1, 0.5, 0.25, 0.375, 0.3125, 0.28125, 0.296875]
    assert max(x for x, m in h if m) == pytest.approx(0.3, rel=0.1)
    h = _search(6, search_over="concurrency", load="closed", start=1)  # integers: 1 2 4 8 6 7
    assert [x for x, _ in h] == [1, 2, 4, 8, 6, 7] and max(x for x, m in h if m) == 6
    assert all(not m for _, m in _search(0.01))  # never met: down to lowest, then stops


def _exp(**kw):
    return to_typed(compose_cfg("experiment=slo_search", SLO, *[f"experiment.{k}={v}" for k, v in kw.items()]),
                    gpu_count=lambda: 0).experiment


def test_the_answer_says_why_the_search_stopped_where_it_did():
    exp = _exp(max_probes=4, highest=256)
    # bracketed and narrowed: 5 met, 5.5 missed
    assert answer(_exp(), [(1, True), (8, False), (5, True), (5.5, False)], "req/s") == \
        "5 req/s (the next probe up, 5.5, missed)"
    # out of probes while still doubling: not "every probe up to highest met it"
    assert answer(exp, [(1, True), (2, True), (4, True), (8, True)], "req/s") == \
        "8 req/s (every probe met it; the search stopped at experiment.max_probes=4 while still doubling)"
    assert answer(_exp(highest=8), [(1, True), (2, True), (4, True), (8, True)], "req/s") == \
        "8 req/s (every probe up to experiment.highest=8 met it)"
    # out of probes before the bracket [4, 8) narrowed to 10 %
    assert answer(exp, [(1, True), (2, True), (4, True), (8, False)], "req/s") == (
        "4 req/s (the next probe up, 8, missed; the search stopped at experiment.max_probes=4 "
        "before narrowing to its tolerance)")
    # a miss below the answer: latencies not monotonic in load
    assert answer(_exp(), [(4, True), (8, False), (6, True), (2, False)], "req/s") == \
        "6 req/s (the next probe up, 8, missed; probes below it missed too: 2)"


def test_an_e2e_slo_is_judged_at_every_allowed_percentile():
    # 10 requests, end to end 100, 110, ..., 190 ms from the scheduled send (20 ms of it
    # waiting in the client). p90 by linear interpolation: rank 0.9 × 9 = 8.1 → 181 ms;
    # p50: rank 4.5 → 145 ms; p99 needs 100 requests.
    recs = [{"ok": True, "status": 200, "ttft_s": 0.01, "e2e_s": e / 1e3 - 0.02, "tpot_s": 0.01,
             "ttft_sched_s": 0.03, "e2e_sched_s": e / 1e3, "output_tokens": 8, "malformed": 0,
             "chunk_s": [0.01, e / 1e3 - 0.02], "chunk_tokens": [1, 7]} for e in range(100, 200, 10)]
    figs = level_figures(recs, wall_s=1.0)
    assert figs["e2e_sched_ms_p90"] == pytest.approx(181.0)
    assert verdict(figs, {"e2e_ms": 182}, 90) == (True, "")
    assert verdict(figs, {"e2e_ms": 180}, 90) == (False, "p90 e2e_ms 181.0 > 180")
    assert verdict(figs, {"e2e_ms": 146}, 50) == (True, "")
    assert verdict(figs, {"e2e_ms": 1e6}, 99) == (False, "no p99 e2e_ms (n=10)")


def test_bad_search_settings_are_named():
    with pytest.raises(ConfigError, match=r"experiment.load='closed' with search_over=rate"):
        to_typed(compose_cfg("experiment=slo_search", SLO, "experiment.load=closed"), gpu_count=lambda: 0)
    with pytest.raises(ConfigError, match=r"p99 needs at least 100 requests"):
        to_typed(compose_cfg("experiment=slo_search", SLO, "experiment.percentile=99"), gpu_count=lambda: 0)
    with pytest.raises(ConfigError, match=r"experiment.slo: no bound set"):
        to_typed(compose_cfg("experiment=slo_search"), gpu_count=lambda: 0)
    with pytest.raises(ConfigError, match=r"experiment.slo.ttft_ms=-3.0: expected a latency in ms > 0"):
        to_typed(compose_cfg("experiment=slo_search", "experiment.slo.ttft_ms=-3"), gpu_count=lambda: 0)



def test_a_sessions_search_is_over_the_sessions_in_flight_and_other_axes_are_refused():
    sessions = ("experiment.load=sessions", "experiment.search_over=concurrency")
    exp = _exp(load="sessions", search_over="concurrency")
    assert (exp.load, exp.search_over) == ("sessions", "concurrency")
    # sessions have no rate of their own: a rate or speedup search over them is refused, naming both keys
    for axis in ("rate", "speedup"):
        with pytest.raises(ConfigError, match=rf"experiment.load='sessions' with search_over={axis}: .*"
                                              r"a concurrency search the closed loop or multi-turn sessions"):
            to_typed(compose_cfg("experiment=slo_search", SLO, "experiment.load=sessions",
                                 f"experiment.search_over={axis}"), gpu_count=lambda: 0)
    # every turn is a sample of the percentile: 4 sessions of 2 turns are 8, p90 needs 10
    with pytest.raises(ConfigError, match=r"experiment.sessions.count=4 x turns=2 = 8 turns a probe: "
                                          r"p90 needs at least 10"):
        to_typed(compose_cfg("experiment=slo_search", SLO, *sessions, "experiment.sessions.count=4",
                             "experiment.sessions.turns=2"), gpu_count=lambda: 0)
    to_typed(compose_cfg("experiment=slo_search", SLO, *sessions, "experiment.sessions.count=5",
                         "experiment.sessions.turns=2"), gpu_count=lambda: 0)  # 10: enough


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    model = fake_model(tmp_path_factory.mktemp("fake_model"))
    yield model
    server.stop_all()
    assert not orphans(marks=fake_marks(model))


def _fake_search(model, tmp_path, *overrides, rec=None):
    ov = [o for o in fake_overrides(model, tmp_path, "FAKE_VLLM_GAP_MS=10") if o != "experiment=macro"]
    cfg = to_typed(compose_cfg("experiment=slo_search", *ov, "experiment.input_tokens=16",
                               "experiment.output_tokens=4", "experiment.warmup=1",
                               "experiment.max_concurrency=1", "experiment.burstiness=1000",
                               "experiment.progress=false", "experiment.requests=12",
                               *overrides, f"paths.outputs={tmp_path}"), gpu_count=lambda: 0)
    rec = rec if rec is not None else MemoryRecorder()
    return rec, runner_for(cfg.experiment)(cfg, tmp_path, rec)


@pytest.mark.fake_server
def test_the_search_finds_the_rate_a_one_slot_server_can_keep(model, tmp_path):
    # One request at a time, 4 tokens ≥ 10 ms apart: s ≥ 30 ms of service (capacity ≤ 33
    # req/s; ~35-45 ms on an idle machine). Regular arrivals (burstiness 1000) at rate r > 1/s
    # queue: request k waits k (s - 1/r), so the 11th of 12 (the p90) waits 10 (s - 1/r) ≥
    # 10 (30 - 20.8) = 92 ms at 48 req/s, over the 60 ms SLO: no machine meets 48, a slow
    # one only meets less. The client-lag rule is off (the absolute rule's max_client_lag_ms
    # lifted), so that late wake-ups on a loaded machine void no probe; the search's
    # bookkeeping is exact.
    rec, summary = _fake_search(model, tmp_path, "experiment.start=8",
                                "experiment.slo={ttft_ms: 60}", "experiment.max_probes=8",
                                "experiment.validity.rule=absolute", "experiment.max_client_lag_ms=1e9")
    answer = summary["max_rate_meeting_slo"]
    assert answer < 48, summary

    def only(c, key):  # a probe is one level: its one value (step = the rate in mHz)
        vals = list(c.latest(key).values())
        return vals[0] if len(vals) == 1 else None

    probes = [(only(c, "target_rate_req_s"), c) for _, c in rec.children]
    meets, loads = rec.latest("probe_meets"), rec.latest("probe_load")  # by probe index
    assert len(probes) == summary["probes"] == len(meets) >= 3
    assert [x for x, _ in probes] == [loads[k] for k in sorted(loads)]
    # the answer is the highest probe that met; every probe above it missed, the lowest of
    # them is the bracket's other end; a probe met exactly when its p90 TTFT (from the
    # scheduled send) was within 60 ms on a valid level
    met = [loads[k] for k, m in meets.items() if m]
    assert answer == max(met)
    above = [k for k in meets if loads[k] > answer]
    assert above and not any(meets[k] for k in above)
    assert summary["lowest_failing_load"] == min(loads[k] for k in above)
    for (_, c), k in zip(probes, sorted(meets)):
        p90 = only(c, "ttft_sched_ms_p90")
        ok = p90 is not None and p90 <= 60 and only(c, "valid") == 1.0
        assert bool(meets[k]) == ok, (loads[k], p90, only(c, "valid"))
    assert all(c.status == "FINISHED" for _, c in rec.children)
    starts = [c.latest("server_starts").get(None) for _, c in rec.children]
    assert starts[0] == 1.0 and set(starts[1:]) == {0.0}  # one server start for the search
    assert (tmp_path / "probes.txt").exists() and (tmp_path / "plots" / "probes.png").exists()
    assert "the next probe up" in rec.tags["slo_search.answer"] or "every probe" in rec.tags["slo_search.answer"]
    # each probe says how its load was sent: an open loop, and nowhere a closed one
    for _, c in rec.children:
        assert c.tags["macro.load"].startswith("open loop: gamma arrivals (burstiness 1000")
        assert "closed" not in c.tags["macro.client"], c.tags["macro.client"]


@pytest.mark.fake_server
def test_an_slo_no_load_meets_is_refused_by_saying_so(model, tmp_path):
    # impossible by construction: 4 tokens ≥ 10 ms apart take ≥ 30 ms end to end, over a 5 ms
    # bound on any machine; high rates, so the three probes take about a second each
    with pytest.raises(NoLoadMeetsSlo, match=r"no probed req/s met the SLO \(p90 of e2e_ms <= 5\); "
                       r"tried 32, 16, 8"):
        _fake_search(model, tmp_path, "experiment.slo={e2e_ms: 5}", "experiment.lowest=8",
                     "experiment.start=32")


@pytest.mark.fake_server
def test_a_speedup_search_replays_a_trace_faster_until_the_slo_breaks(model, tmp_path):
    # A trace of 12 requests 100 ms apart (10 req/s at speedup 1), replayed on the same
    # one-slot server (≥ 30 ms a request): at speedup x they come 100 / x ms apart, and the
    # 11th (the p90) waits 10 (s - 100 / x) ≥ 10 (30 - 20.8) = 92 ms at x = 4.8, over the 60 ms
    # SLO: the answer is below 4.8 on any machine. Each probe's target is the trace's own
    # rate, scaled: 11 gaps over 1.1 s / x = 10 x req/s.
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(f'{{"timestamp": {100 * k}, "input_length": 16, "output_length": 4}}\n'
                             for k in range(12)))
    rec, summary = _fake_search(model, tmp_path, "experiment.search_over=speedup", "experiment.load=trace",
                                f"experiment.trace.path={trace}", "experiment.start=1",
                                "experiment.slo={ttft_ms: 60}", "experiment.max_probes=8",
                                "experiment.validity.rule=absolute", "experiment.max_client_lag_ms=1e9",
                                "experiment.max_rate_error=0.5")
    answer = summary["max_speedup_meeting_slo"]
    assert 1 <= answer < 4.8, summary
    loads, meets = rec.latest("probe_load"), rec.latest("probe_meets")
    assert len(rec.children) == summary["probes"] == len(loads) >= 3
    for (_, c), k in zip(rec.children, sorted(loads)):
        x = loads[k]
        (step,) = c.latest("scheduled_rate_req_s")
        assert step == round(x * 1000) and c.latest("scheduled_rate_req_s")[step] == pytest.approx(10 * x)
        assert c.latest("send_lag_ms_n")[step] == 12 and c.latest("completed")[step] == 12
        assert c.tags["macro.load"].startswith(f"trace replay: {trace} at its own times")
        p90 = c.latest("ttft_sched_ms_p90")[step]
        assert bool(meets[k]) == (p90 <= 60 and c.latest("valid")[step] == 1.0), (x, p90)
    assert answer == max(loads[k] for k, m in meets.items() if m)
    assert rec.tags["slo_search.answer"].startswith(f"{answer:g} speedup (")


SESSIONS = ("experiment.load=sessions", "experiment.search_over=concurrency", "experiment.sessions.turns=2",
            # one late wake-up of a loaded machine voids no probe: these tests are about what a
            # probe sends and how it is judged (the lag rule lifted; no delivery stall of 4 chunks)
            "experiment.validity.rule=absolute", "experiment.max_client_lag_ms=1e9",
            "experiment.stall_min_chunks=100")


@pytest.mark.fake_server
def test_a_sessions_search_probes_sessions_in_flight_and_says_none_met(model, tmp_path):
    # Each turn's 4 tokens come >= 10 ms apart: E2E >= 30 ms on any machine, over a 5 ms bound.
    # From 4 sessions in flight, halving to experiment.lowest=1: probes 4, 2, 1, all missing.
    # Each probe runs max(c, ceil(12 requests / 2 turns)) = 6 sessions of 2 turns: 12 requests.
    rec = MemoryRecorder()
    with pytest.raises(NoLoadMeetsSlo, match=r"no probed sessions met the SLO \(p90 of e2e_ms <= 5\); "
                       r"tried 4, 2, 1, down to experiment.lowest=1"):
        _fake_search(model, tmp_path, *SESSIONS, "experiment.slo={e2e_ms: 5}", "experiment.start=4",
                     "experiment.lowest=1", rec=rec)
    assert rec.latest("probe_load") == {0: 4.0, 1: 2.0, 2: 1.0} and set(rec.latest("probe_meets").values()) == {0.0}
    for (_, c), k, x in zip(rec.children, range(3), (4, 2, 1)):
        assert c.tags["macro.load"].startswith(f"sessions: [{x}] multi-turn sessions in flight")
        assert c.latest("sessions") == {x: 6.0} and c.latest("sessions_completed") == {x: 6.0}
        assert c.latest("turn1_ttft_ms_n") == {x: 6} and c.latest("turn2_ttft_ms_n") == {x: 6}
        assert c.latest("completed") == {x: 12.0}
        recs = [orjson.loads(line) for line in (tmp_path / f"probe{k}" / "requests.jsonl").read_bytes().splitlines()]
        sweep = [r for r in recs if r["phase"] == "sweep"]
        # turn 2 is sent on the history: 16 + 4 answer tokens + a 16-token message
        assert sorted({(r["turn"], r["prompt_tokens_target"], r["usage"]["prompt_tokens"]) for r in sweep}) == [
            (1, 16, 16), (2, 36, 36)]
        assert len({r["session"] for r in sweep}) == 6
    assert "p90 e2e_ms" in (tmp_path / "probes.txt").read_text()


@pytest.mark.fake_server
def test_a_sessions_probe_judges_each_turn_from_its_scheduled_send(model, tmp_path):
    # 0.3 s of think time before turn 2, a 250 ms TTFT bound: counted from the session's
    # start, every turn 2 would miss it (half the samples: p90 too); counted from the turn's
    # own scheduled send (the answer before it + the think time), the think time is not in it.
    rec, summary = _fake_search(model, tmp_path, *SESSIONS, "experiment.sessions.think_time_s=0.3",
                                "experiment.slo={ttft_ms: 250}", "experiment.start=1",
                                "experiment.highest=2")
    loads, meets = rec.latest("probe_load"), rec.latest("probe_meets")
    assert len(rec.children) == summary["probes"] == len(loads)
    for (_, c), k in zip(rec.children, sorted(loads)):
        x = int(loads[k])
        recs = [orjson.loads(line) for line in (tmp_path / f"probe{k}" / "requests.jsonl").read_bytes().splitlines()]
        sweep = [r for r in recs if r["phase"] == "sweep"]
        first = {r["session"]: r for r in sweep if r["turn"] == 1}
        ttft = []
        for r in sweep:
            if r["turn"] == 2:  # due 0.3 s after the first answer ended
                a = first[r["session"]]
                assert r["scheduled_s"] == pytest.approx(a["sent_s"] + a["end_s"] + 0.3, abs=1e-6)
            ttft.append((max(r["sent_s"] - r["scheduled_s"], 0.0) + r["ttft_s"]) * 1e3)
        p90 = percentile(ttft, 90)
        assert c.latest("ttft_sched_ms_p90")[x] == pytest.approx(p90)
        assert bool(meets[k]) == (p90 <= 250 and c.latest("valid")[x] == 1.0), (x, p90)
    assert summary["max_concurrency_meeting_slo"] == max(loads[k] for k, m in meets.items() if m)
    assert rec.tags["slo_search.answer"].startswith(f"{summary['max_concurrency_meeting_slo']:g} sessions (")


@pytest.mark.fake_server
def test_every_probe_of_a_search_sends_the_same_drawn_lengths(model, tmp_path):
    # prompts uniform in [floor(16 × 0.5), ceil(16 × 1.5)] = [8, 24], outputs in [2, 6]: request
    # i's lengths depend on the seed and i alone, so every probe sends the same requests and
    # the probes differ only in their load. E2E >= 10 ms a token after the first: every probe
    # misses 5 ms (tried 32, 16, 8 req/s).
    from k25exp.load.lengths import BLOCK

    rec = MemoryRecorder()
    with pytest.raises(NoLoadMeetsSlo, match=r"tried 32, 16, 8"):
        _fake_search(model, tmp_path, "experiment.input_len.dist=uniform", "experiment.input_len.range_ratio=0.5",
                     "experiment.output_len.dist=uniform", "experiment.output_len.range_ratio=0.5",
                     "experiment.slo={e2e_ms: 5}", "experiment.lowest=8", "experiment.start=32", rec=rec)
    seed = to_typed(compose_cfg("experiment=slo_search", SLO), gpu_count=lambda: 0).experiment.seed
    ins = np.random.default_rng([seed, 0, 0]).integers(8, 25, size=BLOCK)[:12]
    outs = np.random.default_rng([seed, 1, 0]).integers(2, 7, size=BLOCK)[:12]
    for k, (_, c) in enumerate(rec.children):
        recs = [orjson.loads(line) for line in (tmp_path / f"probe{k}" / "requests.jsonl").read_bytes().splitlines()]
        sweep = sorted((r for r in recs if r["phase"] == "sweep"), key=lambda r: r["i"])
        assert [(r["prompt_tokens_target"], r["max_tokens"]) for r in sweep] == list(zip(ins, outs))
        # (the fake server counts a text prompt's words, not its tokens: outputs only)
        assert [r["usage"]["completion_tokens"] for r in sweep] == list(outs)
        (step,) = c.latest("input_len_mean")
        assert c.latest("input_len_mean")[step] == pytest.approx(ins.mean())
        assert c.latest("output_len_max")[step] == outs.max()
        assert c.tags["macro.input_len"] == "uniform, mean 16, range_ratio 0.5, clipped to [1, none]"
