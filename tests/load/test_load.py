"""Open-loop load, the statistics that say how sure a figure is, and goodput: the arrival
schedule against its definition, latency from the scheduled send against a stub server whose
timing is known, and figures against hand counts."""

from __future__ import annotations

import asyncio
import math
import time

import numpy as np
import pytest

from k25exp.load.arrivals import rate_of, schedule
from k25exp.load.client import CompletionClient, run_level, run_open_level
from k25exp.load.level_figures import goodput, level_figures, rate_figures
from tests.serving.stub_server import StubThread
from k25exp.stats import bootstrap_ci, suppressed


@pytest.mark.parametrize("burstiness,cv", [(1.0, 1.0), (4.0, 0.5), (0.25, 2.0)])
def test_arrivals_have_the_asked_mean_rate_and_coefficient_of_variation(burstiness, cv):
    # gamma gaps of shape k and mean 1/rate: CV = 1/sqrt(k) (Poisson: k = 1, CV 1)
    due = schedule(5.0, burstiness, seed=7, n=20001)
    gaps = np.diff(due)
    assert due[0] == 0.0 and len(gaps) == 20000 and (gaps >= 0).all()
    # standard error of the mean gap: cv × 0.2 / sqrt(20000) ≈ 0.0014 × cv; 4 of them
    assert gaps.mean() == pytest.approx(0.2, abs=4 * cv * 0.2 / math.sqrt(20000))
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.06)
    assert rate_of(due) == pytest.approx(5.0, rel=0.03)
    assert (schedule(5.0, burstiness, seed=7, n=50) == schedule(5.0, burstiness, seed=7, n=50)).all()


def test_an_exact_schedule_realises_its_rate_and_keeps_its_shape():
    loose = schedule(2.0, 1.0, seed=2011, n=20)
    exact = schedule(2.0, 1.0, seed=2011, n=20, exact=True)
    assert abs(rate_of(loose) / 2.0 - 1) > 0.05  # this draw is well off its mean ...
    assert rate_of(exact) == pytest.approx(2.0, rel=1e-12)  # ... the exact one is not
    # the same draw, scaled: every gap keeps its share of the whole
    assert np.diff(exact) / np.diff(exact).sum() == pytest.approx(np.diff(loose) / np.diff(loose).sum())


def test_a_duration_schedule_stops_inside_it():
    due = schedule(10.0, 1.0, seed=1, duration_s=30.0)
    assert due.max() < 30.0 and len(due) == pytest.approx(300, rel=0.15)  # Poisson: ±√300
    assert (schedule(3.0, 1.0, 0, n=4, duration_s=None) >= 0).all()
    with pytest.raises(ValueError, match="exactly one"):
        schedule(1.0, 1.0, 0)
    with pytest.raises(ValueError, match="burstiness 0"):
        schedule(1.0, 0, 0, n=3)


def test_latency_from_the_scheduled_send_counts_the_wait_for_a_slot():
    # every request due at once, one slot: request k waits for the k before it. Each takes
    # the stub's 60 ms "prefill" + 3 tokens 20 ms apart ≈ 0.1 s.
    with StubThread(gap_s=0.02, ttft_s=0.06) as stub:
        async def go():
            async with CompletionClient(stub.base_url, "stub", timeout_s=10.0) as c:
                return await run_open_level(c, lambda i: "fine", phase="sweep", level=99,
                                            due_s=[0.0, 0.0, 0.0], max_tokens=4,
                                            t0=time.perf_counter(), max_concurrency=1)

        res = asyncio.run(go())
    recs = sorted(res["records"], key=lambda r: r["sent_s"])
    assert [r["ok"] for r in recs] == [True] * 3
    for k, r in enumerate(recs):
        wait = r["sent_s"] - r["scheduled_s"]
        # the slot frees only after the request before it has streamed (its first token at
        # the latest; when within its stream end the client stamps is its own business): the
        # wait covers the requests before it, and a busy machine only adds to it
        prev_end = recs[k - 1]["sent_s"] + recs[k - 1]["ttft_s"] if k else r["scheduled_s"]
        assert r["sent_s"] >= prev_end
        assert r["ttft_s"] >= 0.06  # the stub's prefill, from the actual send
        assert r["ttft_sched_s"] == pytest.approx(wait + r["ttft_s"], abs=1e-6)
        assert r["e2e_sched_s"] == pytest.approx(wait + r["e2e_s"], abs=1e-6)
        # the wait splits into the slot's (the cap's doing) and the client's own lateness;
        # the slot's part holds the requests before it, so the lateness is only what the
        # client took after the slot freed
        assert (r["queue_ms"] + r["lag_ms"]) / 1e3 == pytest.approx(wait, abs=1e-9)
        assert r["scheduled_s"] + r["queue_ms"] / 1e3 >= prev_end - 1e-6
        assert 0 <= r["lag_ms"] / 1e3 <= r["sent_s"] - prev_end + 1e-6
    # two requests of ≥ 60 + 3 × 20 ms before it: queued, not late
    assert recs[2]["ttft_sched_s"] > 0.24 and recs[2]["queue_ms"] > 240
    f = level_figures(recs, res["wall_s"], max_client_lag_ms=10.0)
    assert f["client_lag_ms_max"] == max(r["lag_ms"] for r in recs)  # the queue is not in it


def test_lateness_before_the_due_time_is_client_lag_even_under_a_cap():
    # the event loop is blocked 60 ms from 70 ms on, so the request due at 100 ms goes out at
    # ~130 ms: 30 ms late with every slot free. That is the client's lag, not a queue.
    with StubThread(gap_s=0.001) as stub:
        async def go():
            async with CompletionClient(stub.base_url, "stub", timeout_s=10.0) as c:
                asyncio.get_running_loop().call_later(0.07, time.sleep, 0.06)
                return await run_open_level(c, lambda i: "fine", phase="sweep", level=1,
                                            due_s=[0.1], max_tokens=2, t0=time.perf_counter(),
                                            max_concurrency=4)

        (r,) = asyncio.run(go())["records"]
    assert r["queue_ms"] < 5 and r["lag_ms"] > 20
    assert (r["queue_ms"] + r["lag_ms"]) / 1e3 == pytest.approx(r["sent_s"] - r["scheduled_s"], abs=1e-9)


def test_open_loop_sends_on_schedule_and_the_rate_check_says_so():
    due = schedule(20.0, 1.0, seed=3, n=30)
    with StubThread(gap_s=0.001) as stub:
        async def go():
            async with CompletionClient(stub.base_url, "stub", timeout_s=10.0) as c:
                return await run_open_level(c, lambda i: "fine", phase="sweep", level=20.0,
                                            due_s=due, max_tokens=4, t0=time.perf_counter())

        res = asyncio.run(go())
    f = rate_figures(res["records"], res["due_s"], 20.0, 0.05)
    assert f["scheduled_rate_req_s"] == pytest.approx(29 / due[-1])
    # the pace the client kept, by hand (how close to the schedule is the machine's; the
    # sends never precede it, within the loop's 1 ms timer resolution)
    sent = [r["sent_s"] for r in res["records"]]
    assert all(r["sent_s"] - r["scheduled_s"] > -0.002 for r in res["records"])
    assert f["achieved_rate_req_s"] == pytest.approx(29 / (max(sent) - min(sent)))
    err = (f["achieved_rate_req_s"] - 29 / due[-1]) / (29 / due[-1]) * 100
    assert f["rate_error_pct"] == pytest.approx(err) and f["rate_missed"] == float(abs(err) > 5)
    # a client that sent everything 0.5 s late but at the same pace still kept the rate;
    # one that sent at half the pace did not
    late = [dict(r, sent_s=r["scheduled_s"] + 0.5) for r in res["records"]]
    assert rate_figures(late, due, 20.0, 0.05)["rate_missed"] == 0.0
    t_first = min(r["scheduled_s"] for r in res["records"])
    slow = [dict(r, sent_s=t_first + 2 * (r["scheduled_s"] - t_first)) for r in res["records"]]
    g = rate_figures(slow, due, 20.0, 0.05)
    assert g["rate_error_pct"] == pytest.approx(-50.0, abs=0.5) and g["rate_missed"] == 1.0


def test_closed_loop_ramp_staggers_the_first_sends():
    # each request outlasts the ramp (2 tokens 0.3 s apart), so each worker sends one
    with StubThread(gap_s=0.3) as stub:
        async def go():
            async with CompletionClient(stub.base_url, "stub", timeout_s=10.0) as c:
                return await run_level(c, lambda i: "fine", phase="sweep", level=4, concurrency=4,
                                       max_tokens=2, t0=time.perf_counter(), n_requests=4,
                                       ramp_s=0.2)

        res = asyncio.run(go())
    assert sorted(r["worker"] for r in res["records"]) == [0, 1, 2, 3]
    first = sorted(r["scheduled_s"] for r in res["records"])
    assert np.diff(first) == pytest.approx([0.05, 0.05, 0.05], abs=0.01)  # 0.2 s / 4 workers


def _rec(ttft, tpot, e2e, out=10, ok=True, wait=0.0):
    return {"ok": ok, "ttft_s": ttft, "tpot_s": tpot, "e2e_s": e2e, "ttft_sched_s": ttft + wait,
            "e2e_sched_s": e2e + wait, "output_tokens": out}


def test_goodput_counts_by_hand():
    recs = [_rec(0.10, 0.020, 0.30),                 # good
            _rec(0.10, 0.020, 0.30, wait=0.15),       # TTFT from the schedule 0.25 s: bad
            _rec(0.05, 0.040, 0.40),                 # TPOT 40 ms: bad
            _rec(0.05, 0.010, 0.20, out=7),          # good
            _rec(0.01, 0.010, 0.10, ok=False)]       # failed: never good
    g = goodput(recs, wall_s=2.0, slo={"ttft_ms": 200, "tpot_ms": 30})
    assert g == {"goodput_req_s": 1.0, "goodput_tok_s": 8.5, "good_fraction": 0.4}  # 2 good, 17 tokens
    assert goodput(recs, 2.0, {"e2e_ms": 350})["good_fraction"] == 0.4  # 0.30, 0.20 (not 0.45, 0.40)
    assert goodput(recs, 2.0, {}) == {}


def _fake_level(n):
    recs = []
    for i in range(n):
        cs = [0.05 + 0.001 * i + 0.01 * k for k in range(5)]
        recs.append({"ok": True, "status": 200, "chunk_s": cs, "chunk_tokens": [1] * 5,
                     "output_tokens": 5, "prompt_tokens": 4, "ttft_s": cs[0], "e2e_s": cs[-1],
                     "tpot_s": (cs[-1] - cs[0]) / 4, "lag_ms": 0.0, "ttft_sched_s": cs[0],
                     "e2e_sched_s": cs[-1], "malformed": 0})
    return recs


def test_percentiles_below_their_sample_count_are_not_figures():
    f9 = level_figures(_fake_level(9), wall_s=1.0)
    assert f9["ttft_ms_n"] == 9 and "ttft_ms_p50" in f9
    assert "ttft_ms_p90" not in f9 and "ttft_ms_p99" not in f9
    assert suppressed(f9, "ttft_ms_p90") == "n<10" and suppressed(f9, "ttft_ms_p99") == "n<100"
    f10 = level_figures(_fake_level(10), wall_s=1.0)
    assert "ttft_ms_p90" in f10 and "ttft_ms_p99" not in f10 and suppressed(f10, "ttft_ms_p90") is None
    f100 = level_figures(_fake_level(100), wall_s=1.0)
    # TTFT i: 50 + i ms; p99 over 100 = rank 98.01 → 148.01 ms
    assert f100["ttft_ms_p99"] == pytest.approx(148.01) and f100["ttft_ms_n"] == 100
    # every median carries a bootstrap interval around it
    lo, hi = f100["ttft_ms_p50_ci_lo"], f100["ttft_ms_p50_ci_hi"]
    assert lo <= f100["ttft_ms_p50"] <= hi and hi - lo < 20


def _level_in_windows(tokens_per_window, window_s=1.0, out=8):
    """Requests of `out` tokens (ignore_eos: every one the same size), one chunk a token,
    sent at 0 and streaming so that window k (of window_s seconds) receives
    tokens_per_window[k] tokens: the level's delivery, window by window, is known."""
    recs, k = [], 0
    times = [w * window_s + (j + 0.5) * window_s / n for w, n in enumerate(tokens_per_window)
             for j in range(n)]
    assert len(times) % out == 0
    for k in range(0, len(times), out):
        cs = times[k:k + out]
        recs.append({"ok": True, "status": 200, "sent_s": 0.0, "chunk_s": cs,
                     "chunk_tokens": [1] * out, "output_tokens": out, "prompt_tokens": 4,
                     "ttft_s": cs[0], "e2e_s": cs[-1], "tpot_s": (cs[-1] - cs[0]) / (out - 1),
                     "lag_ms": 0.0, "ttft_sched_s": cs[0], "e2e_sched_s": cs[-1], "malformed": 0})
    return recs, [(0.0, len(tokens_per_window) * window_s)]


def test_throughput_interval_has_the_width_of_what_varies():
    """output_tok_s's interval is over time windows of the level (batch means): every request
    has the same token count under ignore_eos, so resampling requests over a fixed wall time
    (the old interval) gave zero width always. Here 10 one-second windows alternate 40 and
    80 tokens (mean 60 tok/s): a bootstrap of the mean of 10 such windows has a standard
    error of 20 / sqrt(10) = 6.3 tok/s, so a 95 % interval about 2 x 1.96 x 6.3 = 25 tok/s
    wide. A level that delivered 60 tokens in every window has nothing that varies: zero width."""
    recs, spans = _level_in_windows([40, 80] * 5)
    f = level_figures(recs, wall_s=10.0, spans=spans)
    assert f["output_tok_s"] == pytest.approx(60.0)
    lo, hi = f["output_tok_s_ci_lo"], f["output_tok_s_ci_hi"]
    assert lo < 60.0 < hi
    assert hi - lo == pytest.approx(2 * 1.96 * 20 / math.sqrt(10), rel=0.25)
    assert lo > 40.0 and hi < 80.0  # the mean of 10 windows, never one window's rate
    recs, spans = _level_in_windows([64] * 10)  # steady: 8 requests of 8 tokens per second
    f = level_figures(recs, wall_s=10.0, spans=spans)
    assert f["output_tok_s_ci_lo"] == f["output_tok_s_ci_hi"] == pytest.approx(64.0)


def test_bootstrap_interval_of_a_median():
    assert bootstrap_ci([3.0] * 10) == (3.0, 3.0)
    xs = np.random.default_rng(0).normal(10.0, 1.0, 400)
    lo, hi = bootstrap_ci(xs)
    # the median's standard error for a normal sample: 1.2533 σ / √n ≈ 0.063; ±1.96 of it
    assert hi - lo == pytest.approx(2 * 1.96 * 1.2533 / 20, rel=0.3)
    assert lo < 10.0 < hi
    with pytest.raises(ValueError, match="at least 2"):
        bootstrap_ci([1.0])


def test_a_traces_schedule_is_kept_and_its_send_lag_figures_follow_from_the_records(tmp_path):
    """A trace's times (ms) scaled by its speedup are each request's scheduled send; the send
    lag figures are the records' sent − scheduled, by hand."""
    from k25exp.load.level_figures import send_lag_figures
    from k25exp.load.trace import read_trace

    f = tmp_path / "trace.jsonl"
    f.write_text("".join(f'{{"timestamp": {t}, "input_length": 8, "output_length": 2}}\n'
                         for t in (100, 300, 300, 700)))
    due = read_trace(str(f)).due_s(speedup=2.0)
    assert due.tolist() == pytest.approx([0.0, 0.1, 0.1, 0.3])  # (t − 100) ms / 1000 / 2
    with StubThread(gap_s=0.001) as stub:
        async def go():
            async with CompletionClient(stub.base_url, "stub", timeout_s=10.0) as c:
                t0 = time.perf_counter()
                return t0, await run_open_level(c, lambda i: "fine", phase="sweep", level=2.0,
                                                due_s=due, max_tokens=2, t0=t0)

        t0, res = asyncio.run(go())
    recs = sorted(res["records"], key=lambda r: r["i"])
    start = res["start"] - t0
    assert [r["scheduled_s"] - start for r in recs] == pytest.approx(due.tolist(), abs=1e-9)
    lags = sorted((r["sent_s"] - r["scheduled_s"]) * 1e3 for r in recs)
    assert all(x > -2 for x in lags)  # never before its time (the loop's 1 ms timer resolution)
    g = send_lag_figures(recs)
    assert g["send_lag_ms_n"] == 4 and g["send_lag_ms_p50"] == pytest.approx((lags[1] + lags[2]) / 2)
    assert g["send_lag_ms_mean"] == pytest.approx(sum(lags) / 4) and "send_lag_ms_p99" not in g  # < 100
    many = [{"sent_s": i * 1e-3 + 0.5, "scheduled_s": 0.5} for i in range(101)]  # lags 0 … 100 ms
    assert send_lag_figures(many)["send_lag_ms_p99"] == pytest.approx(99.0)
