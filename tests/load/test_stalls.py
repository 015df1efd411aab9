"""Delivery stalls: hand-made chunk times, then a real HTTP stub that holds chunks back for a
known time and releases them in one write (the stall the detector must find, to the ms)."""

from __future__ import annotations

import asyncio
import time

import pytest

from k25exp.load import stalls
from k25exp.load.client import CompletionClient, finish, run_level
from k25exp.load.level_figures import invalid_reason, level_figures
from k25exp.load.stalls import Stall, StallRule, find_stalls
from tests.serving.stub_server import StubThread, burst_possible

STEP = 0.030  # a 30 ms decode step


def test_steady_stream_has_no_stall():
    assert find_stalls([i * STEP for i in range(16)], STEP) == []


def test_silence_then_burst_is_one_stall_of_the_silence():
    # 4 chunks at the step, a 1.18 s silence, 4 chunks within 0.1 ms, one more at the step:
    # the shape seen on the slow CI machine
    t = [0.0, 0.03, 0.06, 0.09, 1.27, 1.2701, 1.2702, 1.2703, 1.3003]
    assert find_stalls(t, STEP) == [Stall(4, pytest.approx(1180.0), 4)]


def test_what_is_not_a_stall():
    # two chunks together is below the 3-chunk burst
    assert find_stalls([0.0, 0.03, 0.5, 0.5001, 0.53], STEP) == []
    # a burst after a silence of only 1.5 steps: little was held back
    assert find_stalls([0.0, 0.03, 0.075, 0.0751, 0.0752, 0.105], STEP) == []
    # gaps of 0.2 steps are slow for a burst (the threshold is 0.1 step)
    assert find_stalls([0.0, 0.5, 0.506, 0.512, 0.518], STEP) == []
    # a 4 ms silence at a 1 ms step is 4 steps, but below the 5 ms floor
    assert find_stalls([0.0, 0.001, 0.005, 0.005001, 0.005002], 0.001) == []
    assert find_stalls([0.0, 0.001, 0.005, 0.005001, 0.005002], 0.001,
                       StallRule(min_gap_ms=3.0)) == [Stall(2, pytest.approx(4.0), 3)]


def test_burst_at_the_first_chunk_is_estimated_from_the_step():
    t = [0.2, 0.2001, 0.2002, 0.23, 0.26]
    assert find_stalls(t, STEP) == [Stall(0, pytest.approx(2 * 30.0), 3)]


def test_two_stalls_in_one_request():
    t = [0.0, 0.1, 0.1, 0.1, 0.13, 0.33, 0.33, 0.33, 0.33]
    assert find_stalls(t, STEP) == [Stall(1, pytest.approx(100.0), 3),
                                    Stall(5, pytest.approx(200.0), 4)]


def _rec(chunk_s):
    n = len(chunk_s)
    return finish({"status": 200, "done": True, "chunk_s": chunk_s, "chunk_tokens": [1] * n,
                   "usage": {"completion_tokens": n, "prompt_tokens": 4}})


def test_level_figures_flag_the_stall_and_keep_the_clean_tpot():
    steady = [_rec([0.1 + i * STEP for i in range(9)]) for _ in range(2)]  # TPOT 30 ms
    # 8 gaps, last−first = 0.03*3 + 0.6 + 0.0002*3 + 0.03 = 0.7206 s → TPOT 90.075 ms
    stalled = _rec([0.1, 0.13, 0.16, 0.19, 0.79, 0.7902, 0.7904, 0.7906, 0.8206])
    f = level_figures(steady + [stalled], wall_s=1.0, max_client_lag_ms=1e9)
    # the reference step is the median request TPOT: 30 ms
    assert f["stall_ref_step_ms"] == pytest.approx(30.0)
    assert stalled["stalls"] == [[4, pytest.approx(600.0), 4]] and steady[0]["stalls"] == []
    assert (f["delivery_stalls"], f["stalled_requests"]) == (1, 1)
    assert f["delivery_stall_ms_max"] == pytest.approx(600.0)
    assert f["tpot_ms_mean"] == pytest.approx((30 + 30 + 90.075) / 3)
    assert f["tpot_ms_mean_no_stalls"] == pytest.approx(30.0) and f["tpot_n_no_stalls"] == 2
    assert f["valid"] == 0.0 and f["client_lagged"] == 0.0
    assert invalid_reason(f) == "delivery stall"
    clean = level_figures(steady, wall_s=1.0, max_client_lag_ms=1e9)
    assert clean["delivery_stalls"] == 0 and clean["valid"] == 1.0 and invalid_reason(clean) == ""
    assert stalls.figures([]) == {"delivery_stalls": 0, "stalled_requests": 0,
                                  "delivery_stall_ms_max": 0.0, "delivery_stall_ms_total": 0.0}


def _sent(sent_s, chunk_abs, prompt_tokens=1000):
    """A record sent at sent_s whose chunks arrived at the absolute times chunk_abs (s)."""
    n = len(chunk_abs)
    return finish({"status": 200, "done": True, "sent_s": sent_s,
                   "chunk_s": [t - sent_s for t in chunk_abs], "chunk_tokens": [1] * n,
                   "usage": {"completion_tokens": n, "prompt_tokens": prompt_tokens}})


def test_steps_that_share_prefills_are_not_the_step_bursts_are_judged_against():
    """Long prompts: a decode step that carries a prefill chunk takes 500 ms, one that carries
    none 5 ms. A and B decode across C's and D's prefills (chunks every 5 ms, one 500 ms gap:
    TPOT 535 / 8 = 66.875 ms); C and D decode after them, 5 ms a token. Against the engine's
    mean TPOT (62.5 ms) a 5 ms gap is under a tenth of a step: every request read as a
    burst, i.e. a stall. By hand, decode_prefills' line through (250 shared tokens a step,
    66.875 ms) for A, B (C's and D's 1,000-token prompts in their 8 steps) and (0, 5 ms) for
    C, D has its intercept, the decode-only TPOT, at 5 ms: the reference, and no stall."""
    a = [0.100, 0.105, 0.110, 0.115, 0.615, 0.620, 0.625, 0.630, 0.635]
    c = [0.615 + 0.005 * i for i in range(9)]
    recs = [_sent(0.0, a), _sent(0.0, a), _sent(0.2, c), _sent(0.2, c)]
    f = level_figures(recs, wall_s=1.0, max_client_lag_ms=1e9, step_ref_s=0.0625)
    assert f["decode_only_tpot_ms"] == pytest.approx(5.0)
    assert f["prefill_shared_us_per_token"] == pytest.approx(61.875 / 250 * 1e3)
    assert f["stall_ref_step_ms"] == pytest.approx(5.0)
    assert f["delivery_stalls"] == 0 and f["valid"] == 1.0
    # a real hold-back is still one: D's last six tokens held 100 ms and released within
    # 0.5 ms. D's TPOT (0.5353 + 0.2 − 0.615) / 8 = 15.0375 ms moves the intercept to the
    # mean of C's and D's, 10.01875 ms: a burst is under 1.0 ms, a silence over 20.04 ms
    d = [0.615, 0.620, 0.625, 0.725, 0.7251, 0.7252, 0.7253, 0.7303, 0.7353]
    recs = [_sent(0.0, a), _sent(0.0, a), _sent(0.2, c), _sent(0.2, d)]
    f = level_figures(recs, wall_s=1.0, max_client_lag_ms=1e9, step_ref_s=0.0625)
    assert f["stall_ref_step_ms"] == pytest.approx((5.0 + 15.0375) / 2)
    assert recs[3]["stalls"] == [[3, pytest.approx(100.0), 4]]
    assert [r["stalls"] for r in recs[:3]] == [[], [], []] and f["valid"] == 0.0


def _level(stub, prompt: str, n_requests: int, max_tokens: int):
    """The level's records (by request), figures, and each request's chunk arrivals beside the
    stub's own write times (perf_counter seconds, both)."""
    t0 = time.perf_counter()

    async def go():
        async with CompletionClient(stub.base_url, "stub", timeout_s=10.0) as c:
            return await run_level(c, lambda i: prompt, phase="sweep", level=1, concurrency=1,
                                   max_tokens=max_tokens, t0=t0, n_requests=n_requests)

    res = asyncio.run(go())
    recs = sorted(res["records"], key=lambda r: r["i"])
    arrivals = [[t0 + r["sent_s"] + c for c in r["chunk_s"]] for r in recs]
    assert len(stub.writes) == len(recs)  # one at a time: the stub's order is the client's
    return recs, level_figures(res["records"], res["wall_s"], res["cpu_s"], res["loop_lag_ms"],
                               max_client_lag_ms=1e9, target_output=max_tokens), \
        list(zip(stub.writes, arrivals))


def test_a_stub_that_holds_chunks_500_ms_is_flagged_as_the_silence_the_stub_kept():
    """20 ms per token; from token 16 of 32 on, 25 tokens are held for ≥ 500 ms, then released
    in one write. The stall is found at chunk 16 and measures the silence the stub's own
    clock kept, to within the spread of delivery delays (a loaded machine lengthens the
    silence itself, never the agreement)."""
    with StubThread(gap_s=0.02, hold_s=0.5) as stub:
        recs, f, timing = _level(stub, "hold", n_requests=3, max_tokens=32)
    assert f["completed"] == 3 and f["output_tokens_mismatch"] == 0
    assert f["stalled_requests"] == 3 and f["delivery_stalls"] >= 3
    for r, (w, a) in zip(recs, timing):
        assert len(w) == len(a) == 32
        delays = [x - y for x, y in zip(a, w)]
        spread_ms = (max(delays) - min(delays)) * 1e3
        held_ms = (w[16] - w[15]) * 1e3
        assert held_ms >= 500.0  # the stub slept at least hold_s after its last write
        [(gap_ms, burst)] = [(g, b) for chunk, g, b in r["stalls"] if chunk == 16]
        assert burst >= 3 and abs(gap_ms - held_ms) <= spread_ms + 1e-3, (gap_ms, held_ms, spread_ms)
    assert f["delivery_stall_ms_max"] == max(g for r in recs for _, g, _ in r["stalls"])
    assert f["valid"] == 0.0 and "delivery stall" in invalid_reason(f)


def test_the_same_stub_without_holding_back_flags_nothing():
    """No false stall: while the stub's writes and their delivery leave no two arrivals within
    a burst's 0.1 step (burst_possible, from the stub's own clock), nothing is flagged; on a
    machine that bunched them, the test says so (xfail) rather than pass or fail on timing."""
    with StubThread(gap_s=0.02, hold_s=0.5) as stub:
        recs, f, timing = _level(stub, "fine", n_requests=3, max_tokens=32)
    assert f["completed"] == 3
    why = [w for w in (burst_possible(w, a, 0.1 * f["stall_ref_step_ms"] / 1e3) for w, a in timing) if w]
    if why:
        pytest.xfail("the machine bunched the stream: " + "; ".join(why))
    assert f["delivery_stalls"] == 0 and f["delivery_stall_ms_max"] == 0
    assert all(r["stalls"] == [] for r in recs)
    assert "delivery stall" not in invalid_reason(f)
    assert f["tpot_ms_mean_no_stalls"] == pytest.approx(f["tpot_ms_mean"])


def test_whole_streams_in_one_burst_need_the_engines_step():
    """Every request's 16 chunks arrive within 1.5 ms after a 1.1 s TTFT (the shape seen with a
    starved client): against the level's own median TPOT (0.1 ms) nothing looks short, against
    the engine's 8 ms step each request is one stall at its first chunk, 15 × 8 = 120 ms."""
    recs = [_rec([1.1 + i * 0.0001 for i in range(16)]) for _ in range(3)]
    assert level_figures(recs, wall_s=4.0, max_client_lag_ms=1e9)["delivery_stalls"] == 0
    f = level_figures(recs, wall_s=4.0, max_client_lag_ms=1e9, step_ref_s=0.008)
    assert f["stall_ref_step_ms"] == pytest.approx(8.0)
    assert f["delivery_stalls"] == 3 and recs[0]["stalls"] == [[0, pytest.approx(120.0), 16]]
    assert f["tpot_n_no_stalls"] == 0 and "tpot_ms_mean_no_stalls" not in f
