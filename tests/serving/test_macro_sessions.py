"""Multi-turn sessions against the real vLLM CPU server (the package's session server): each
turn's prompt is the session's history plus a new message, and vLLM counts exactly that; the
think times are the seeded ones; the per-turn TTFT and the prefix cache's state are logged.

Every expectation is worked out here by hand: the history lengths from the fixed shape, the
pauses with numpy's generator from the seed, the per-turn medians from the records.
"""

from __future__ import annotations

import numpy as np
import pytest

from k25exp.stats import percentile
from tests.serving.test_macro_runner import records, run_macro

pytestmark = pytest.mark.vllm  # the real server


def test_two_sessions_of_three_turns_send_their_history_and_log_per_turn_ttft(vllm, tmp_path,
                                                                             record_property):
    cfg, rec, summary = run_macro(
        tmp_path, *vllm["overrides"], "experiment.warmup=1", "experiment.progress=false",
        "experiment.load=sessions", "experiment.concurrency=[2]", "experiment.sessions.count=2",
        "experiment.sessions.turns=3", "experiment.sessions.think_time_s=0.2",
        "experiment.sessions.think_dist=exponential", "experiment.input_tokens=24",
        "experiment.output_tokens=6", "experiment.single_stream_requests=1")
    seed = cfg.experiment.seed
    sweep = sorted((r for r in records(tmp_path) if r["phase"] == "sweep"),
                   key=lambda r: (r["session"], r["turn"]))
    assert [(r["session"], r["turn"]) for r in sweep] == [(s, t) for s in (0, 1) for t in (1, 2, 3)]
    for s in (0, 1):
        turns = [r for r in sweep if r["session"] == s]
        for r in turns:
            assert r["ok"], r["error"]
            assert r["usage"]["completion_tokens"] == 6 == sum(r["chunk_tokens"])
        # 24 (the first prompt, BOS counted); 24 + 6 + 24 = 54; 54 + 6 + 24 = 84: vLLM's count
        assert [r["usage"]["prompt_tokens"] for r in turns] == [24, 54, 84]
        assert [r["prompt_tokens_target"] for r in turns] == [24, 54, 84]
        # the pauses before turns 2 and 3: default_rng([seed, 2, s]).exponential(0.2, 2)
        pauses = np.random.default_rng([seed, 2, s]).exponential(0.2, 2)
        assert [r["think_s"] for r in turns] == pytest.approx([0.0, *pauses])
        for a, b, pause in zip(turns, turns[1:], pauses):
            assert b["scheduled_s"] == pytest.approx(a["sent_s"] + a["end_s"] + pause, abs=1e-6)
            assert b["sent_s"] - b["scheduled_s"] > -0.002  # not before it (the loop's 1 ms timer)
    for t in (1, 2, 3):
        ttft = [r["ttft_s"] * 1e3 for r in sweep if r["turn"] == t]
        assert rec.latest(f"turn{t}_ttft_ms_n")[2] == 2
        assert rec.latest(f"turn{t}_ttft_ms_p50")[2] == pytest.approx(percentile(ttft, 50))
        assert 2 not in rec.latest(f"turn{t}_ttft_ms_p99")  # 2 samples: no p99
        record_property(f"turn{t}_ttft_ms_p50", rec.latest(f"turn{t}_ttft_ms_p50")[2])
    assert rec.latest("turn3_prompt_tokens_mean")[2] == 84
    assert (rec.latest("sessions")[2], rec.latest("sessions_completed")[2]) == (2, 2)
    table = (tmp_path / "results_turns.txt").read_text()
    # vLLM's CPU build serves the tiny Kimi (MLA) without prefix caching, except on its AMX MLA
    # path (vllm/platforms/cpu.py): whichever this CPU runs, the level says what the server did
    if rec.latest("prefix_caching_enabled")[2] == 0:  # said, not a hit rate of 0
        assert 2 not in rec.latest("prefix_cache_hit_rate")
        assert "c=2: prefix caching off on the server" in table and "MLA" in table
    else:
        assert rec.latest("prefix_caching_enabled")[2] == 1
        # every prompt token of the level's six turns looked up once: 2 × (24 + 54 + 84)
        assert rec.latest("prefix_cache_queries")[2] == 2 * (24 + 54 + 84)
        hits = rec.latest("prefix_cache_hits")[2]
        assert 0 <= hits <= 2 * (24 + 54 + 84)
        assert rec.latest("prefix_cache_hit_rate")[2] == pytest.approx(hits / 324)
        assert "c=2: prefix-cache hit rate" in table and "off on the server" not in table
    assert (tmp_path / "plots" / "ttft_by_turn.png").stat().st_size > 0
    assert rec.tags["macro.sessions"].startswith("3 turns a session, 2 sessions a level")
    record_property("prefix_caching_enabled", rec.latest("prefix_caching_enabled")[2])
    record_property("results_turns", table)


def test_goodput_judges_each_turn_from_its_own_scheduled_send(vllm, tmp_path):
    # 1 s of think time before turns 2 and 3, a 800 ms TTFT bound. A turn's TTFT counts from
    # its scheduled send (the answer before it + the think time), so the think time is never
    # in it; counted from the session's start, no later turn could meet the bound.
    _, rec, _ = run_macro(
        tmp_path, *vllm["overrides"], "experiment.warmup=1", "experiment.progress=false",
        "experiment.load=sessions", "experiment.concurrency=[2]", "experiment.sessions.count=2",
        "experiment.sessions.turns=3", "experiment.sessions.think_time_s=1.0",
        "experiment.input_tokens=24", "experiment.output_tokens=6",
        "experiment.single_stream_requests=0", "experiment.slo.ttft_ms=800")
    sweep = [r for r in records(tmp_path) if r["phase"] == "sweep"]
    assert len(sweep) == 6 and all(r["ok"] for r in sweep)
    first = {r["session"]: r["scheduled_s"] for r in sweep if r["turn"] == 1}
    for r in sweep:  # a later turn is due over a second after its session began (1 ms: the loop's timer)
        assert r["scheduled_s"] - first[r["session"]] >= (r["turn"] - 1) * 1.0 - 0.002

    def ttft_from_schedule(r):  # the wait in the client (never negative), then its TTFT
        return max(r["sent_s"] - r["scheduled_s"], 0.0) + r["ttft_s"]

    good = [r for r in sweep if ttft_from_schedule(r) <= 0.8]
    assert rec.latest("good_fraction")[2] == pytest.approx(len(good) / 6)
    assert rec.latest("goodput_req_s")[2] == pytest.approx(len(good) / rec.latest("wall_s")[2])
    whole = [s for s in (0, 1) if sum(r["session"] == s for r in good) == 3]
    assert rec.latest("good_session_fraction")[2] == len(whole) / 2
