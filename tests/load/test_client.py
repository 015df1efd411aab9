"""The HTTP client and the figures, against a loopback server that misbehaves on request.

A healthy vLLM never sends a malformed chunk or cuts a stream, so those paths are exercised
with tests.serving.stub_server (a real HTTP server streaming real SSE). Figures are checked
against records whose chunk times are known.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from k25exp.serving import server_metrics
from k25exp.load.client import CompletionClient, finish, run_level
from k25exp.load.level_figures import decode_prefills, level_figures, saturation, tpot_gap_pct
from tests.serving.stub_server import StubThread, burst_possible


@pytest.fixture(scope="module")
def stub():
    with StubThread() as s:
        yield s


def run(coro):
    return asyncio.run(coro)


def test_failures_are_recorded_not_raised(stub):
    async def go():
        async with CompletionClient(stub.base_url, "stub", timeout_s=1.0) as c:
            return {p: await c.complete(p, 8, {}, time.perf_counter())
                    for p in ("fine", "malformed", "http500", "cut", "stream_error", "slow")}

    r = run(go())
    assert r["fine"]["ok"] and r["fine"]["output_tokens"] == 8 and r["fine"]["chunk_tokens"] == [1] * 8
    assert r["fine"]["usage"] == {"prompt_tokens": 1, "completion_tokens": 8, "total_tokens": 9}
    # one bad chunk is counted; the request still completes with the server's usage
    assert r["malformed"]["ok"] and r["malformed"]["malformed"] == 1
    assert r["malformed"]["output_tokens"] == 8
    assert not r["http500"]["ok"] and r["http500"]["status"] == 500
    assert r["http500"]["error"] == "HTTP 500: boom"
    assert not r["cut"]["ok"] and r["cut"]["error"].startswith("transport:")
    assert not r["stream_error"]["ok"] and r["stream_error"]["error"] == "stream: engine hiccup"
    assert not r["slow"]["ok"] and r["slow"]["error"].startswith("timeout")


def test_closed_loop_level_counts_errors_and_keeps_every_record(stub):
    prompts = ["fine", "http500", "fine", "malformed", "fine", "cut"]

    async def go():
        async with CompletionClient(stub.base_url, "stub", timeout_s=5.0) as c:
            return await run_level(c, lambda i: prompts[i], phase="sweep", level=2,
                                   concurrency=2, max_tokens=6, t0=time.perf_counter(),
                                   n_requests=len(prompts))

    res = run(go())
    recs = res["records"]
    assert sorted(r["i"] for r in recs) == list(range(6)) and {r["worker"] for r in recs} == {0, 1}
    assert all(r["sent_s"] >= r["scheduled_s"] for r in recs)
    f = level_figures(recs, res["wall_s"], res["cpu_s"], res["loop_lag_ms"], 1e9, 6)
    assert (f["requests"], f["completed"], f["errors"], f["malformed_chunks"]) == (6, 4, 2, 1)
    assert f["output_tokens"] == 24 and f["output_tok_s"] == pytest.approx(24 / res["wall_s"])
    assert f["output_tokens_mismatch"] == 0  # (valid is moot: the stub shares this process)


def test_prefills_a_decode_step_shares_are_counted_from_the_send_clock():
    """A decodes from 0.1 to 1.0 s (9 steps); B's prefill ends (its first token) at 0.5 s,
    inside A's decode; C's at 1.05 s, after A's last token; B (0.5-0.9 s, 4 steps) and C
    (1.05-2.15 s, 2 steps) see none. 1 prefill of 50 prompt tokens over 9 + 4 + 2 steps."""
    rec = lambda sent, ttft, e2e, out, prompt: {"ok": True, "sent_s": sent, "ttft_s": ttft,
                                                "e2e_s": e2e, "output_tokens": out,
                                                "prompt_tokens": prompt}
    recs = [rec(0.0, 0.1, 1.0, 10, 100), rec(0.3, 0.2, 0.6, 5, 50), rec(0.95, 0.1, 1.2, 3, 20)]
    f = decode_prefills(recs)
    assert f["prefills_per_decode_step"] == pytest.approx(1 / 15)
    assert f["prefill_tokens_per_decode_step"] == pytest.approx(50 / 15)
    assert decode_prefills([rec(0.0, 0.1, 0.1, 1, 9)]) == {}  # one token: no decode step


def test_the_marginal_cost_of_a_shared_prefill_is_fitted_from_the_requests():
    """Four requests whose TPOT is 10 ms + 0.05 ms per shared prompt token per step, by
    construction. First tokens at 0.10 (A), 0.15 (B, 100 prompt tokens), 0.16 (C, 60) and
    1.10 s (D). A decodes 0.100-0.208 s (10 steps) and shares B's and C's prefills: 16
    tokens/step, TPOT 10.8 ms; B decodes 0.150-0.243 s (9 steps) and shares C's: 60/9 per
    step; C and D (10 steps each) share none. Their weighted least squares line is that line:
    intercept 10 ms, slope 50 µs, n = 4."""
    def rec(first: float, steps: int, shared_per_step: float, prompt: int) -> dict:
        tpot_s = (10.0 + 0.05 * shared_per_step) / 1e3
        return {"ok": True, "sent_s": first - 0.1, "ttft_s": 0.1, "output_tokens": steps + 1,
                "e2e_s": 0.1 + steps * tpot_s, "prompt_tokens": prompt}
    recs = [rec(0.10, 10, 16, 10), rec(0.15, 9, 60 / 9, 100), rec(0.16, 10, 0, 60),
            rec(1.10, 10, 0, 20)]
    f = decode_prefills(recs)
    assert f["prefill_tokens_per_decode_step"] == pytest.approx((160 + 60) / 39)
    assert f["prefill_fit_n"] == 4
    assert f["decode_only_tpot_ms"] == pytest.approx(10.0)
    assert f["prefill_shared_us_per_token"] == pytest.approx(50.0)
    # nobody shared a prefill: no slope, the decode-only TPOT is their mean
    lone = [{**rec(1.0 * i, 10, 0, 50), "e2e_s": 0.1 + 10 * 0.012} for i in range(3)]
    g = decode_prefills(lone)
    assert g["decode_only_tpot_ms"] == pytest.approx(12.0) and "prefill_shared_us_per_token" not in g
    assert "decode_only_tpot_ms" not in decode_prefills(lone[:2])  # under 3 requests: no fit


def test_figures_follow_vllm_definitions():
    # two requests with known chunk times (s after sending) and token counts
    a = finish({"status": 200, "done": True, "chunk_s": [0.10, 0.12, 0.15, 0.16],
                "chunk_tokens": [1, 1, 2, 1], "usage": {"completion_tokens": 5, "prompt_tokens": 9},
                "lag_ms": 0.5})
    b = finish({"status": 200, "done": True, "chunk_s": [0.20, 0.30], "chunk_tokens": [1, 1],
                "usage": {"completion_tokens": 2, "prompt_tokens": 9}, "lag_ms": 1.5})
    assert a["ttft_s"] == 0.10 and a["e2e_s"] == 0.16
    assert a["tpot_s"] == pytest.approx((0.16 - 0.10) / (5 - 1))  # tokens from usage, not chunks
    assert b["tpot_s"] == pytest.approx(0.10)
    f = level_figures([a, b], wall_s=0.5, max_client_lag_ms=1.0, target_output=5, target_input=9)
    assert f["ttft_ms_p50"] == pytest.approx(150.0) and f["e2e_ms_p50"] == pytest.approx(230.0)
    assert f["e2e_ms_n"] == 2 and "e2e_ms_p99" not in f  # p99 of 2 requests is no figure
    # from the scheduled send: each request's lag added (0.5 ms, 1.5 ms)
    assert f["ttft_sched_ms_p50"] == pytest.approx((100.5 + 201.5) / 2)
    assert f["tpot_ms_mean"] == pytest.approx((15 + 100) / 2)
    assert f["itl_ms_p50"] == pytest.approx(25.0)  # gaps 10, 20, 30 and 100 ms
    assert f["output_tok_s"] == pytest.approx(7 / 0.5) and f["request_s"] == pytest.approx(4.0)
    assert f["output_tokens_mismatch"] == 1 and f["prompt_tokens_mismatch"] == 0
    # 2 sends are no p99; the level is judged on their max, 1.5 ms > the 1 ms limit
    assert "client_lag_ms_p99" not in f and f["client_lag_ms_max"] == 1.5 and f["client_lag_n"] == 2
    assert f["client_lagged"] == 1.0 and f["valid"] == 0.0
    many = [dict(a, lag_ms=0.01 * i) for i in range(100)]  # 0 … 0.99 ms: p99 0.9801 by hand
    g = level_figures(many, wall_s=1.0, max_client_lag_ms=1.0, loop_lag_ms=[0.5] * 99)
    assert g["client_lag_ms_p99"] == pytest.approx(0.9801) and g["client_lagged"] == 0.0
    assert "client_loop_lag_ms_p99" not in g and g["client_loop_lag_n"] == 99
    one = finish({"status": 200, "done": True, "chunk_s": [0.1], "chunk_tokens": [1],
                  "usage": {"completion_tokens": 1}})
    assert one["ok"] and one["tpot_s"] is None
    empty = finish({"status": 200, "done": True, "chunk_s": [], "chunk_tokens": []})
    assert not empty["ok"] and empty["error"] == "no output tokens streamed"


def test_saturation_is_where_throughput_stops_growing():
    assert saturation([1, 2, 4, 8, 16], [10, 19, 36, 38, 39], 0.1) == 4
    assert saturation([1, 2, 4], [10, 20, 40], 0.1) is None
    assert saturation([4, 1, 2], [36, 10, 19], 0.1) is None  # sorted by level first


def test_server_histograms_give_level_means():
    text = """# HELP vllm:request_time_per_output_token_seconds x
vllm:request_time_per_output_token_seconds_sum{engine="0",model_name="m"} 0.5
vllm:request_time_per_output_token_seconds_count{engine="0",model_name="m"} 10.0
vllm:request_time_per_output_token_seconds_bucket{engine="0",le="0.01",model_name="m"} 3.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 2.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 10.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="other"} 99.0
vllm:e2e_request_latency_seconds_count{engine="0",model_name="m"} 10.0
vllm:e2e_request_latency_seconds_sum{engine="0",model_name="m"} 9.0
"""
    before = server_metrics.parse(text, "m")
    after = dict(before)
    after.update({"vllm:request_time_per_output_token_seconds_sum": 0.5 + 4 * 0.02,
                  "vllm:request_time_per_output_token_seconds_count": 14.0,
                  "vllm:time_to_first_token_seconds_sum": 2.4,
                  "vllm:time_to_first_token_seconds_count": 14.0,
                  "vllm:e2e_request_latency_seconds_count": 14.0,
                  "vllm:e2e_request_latency_seconds_sum": 10.0})
    figs, src = server_metrics.level_means(before, after)
    assert before["vllm:time_to_first_token_seconds_sum"] == 2.0  # the other model is not counted
    assert figs["server_tpot_ms_mean"] == pytest.approx(20.0)
    assert figs["server_ttft_ms_mean"] == pytest.approx(100.0)
    assert figs["server_e2e_ms_mean"] == pytest.approx(250.0) and figs["server_requests"] == 4
    assert src["tpot"] == "vllm:request_time_per_output_token_seconds"
    assert tpot_gap_pct({**figs, "tpot_ms_mean": 25.0}) == pytest.approx(25.0)
    assert tpot_gap_pct({"tpot_ms_mean": 25.0}) is None  # no server figure, no gap


def test_a_level_can_run_for_a_duration_instead_of_a_count():
    """A duration-limited level sends every request *due* inside the window, however late the
    client is (a busy machine): here the client is made late on purpose, its event loop blocked
    past the window's end by the first record's callback. The request due before the end is
    still sent, its lateness in lag_ms; none due after the end is. Nothing bounds the clock."""
    window = 1.0
    t = {}

    def block_past_the_window(rec):
        if "blocked" not in t:  # once: a loaded machine that woke the client too late
            t["blocked"] = rec
            while time.perf_counter() < t["start"] + window + 0.05:
                time.sleep(0.01)

    with StubThread(gap_s=0.01) as stub:
        async def go():
            async with CompletionClient(stub.base_url, "stub") as c:
                t["start"] = t0 = time.perf_counter()
                return await run_level(c, lambda i: "fine", phase="sweep", level=3,
                                       concurrency=3, max_tokens=5, t0=t0, start_at=t0,
                                       duration_s=window, on_record=block_past_the_window)

        res = run(go())
    recs = res["records"]
    assert all(r["ok"] for r in recs) and sorted(r["i"] for r in recs) == list(range(len(recs)))
    for w in range(3):  # each worker's chain, by hand: the next is due when the last one ended
        mine = sorted((r for r in recs if r["worker"] == w), key=lambda r: r["scheduled_s"])
        assert mine and mine[0]["scheduled_s"] == 0.0
        for a, b in zip(mine, mine[1:]):
            assert b["scheduled_s"] == pytest.approx(a["sent_s"] + a["end_s"], abs=1e-9)
        assert all(r["scheduled_s"] < window for r in mine)  # due inside: sent
        assert mine[-1]["sent_s"] + mine[-1]["end_s"] >= window  # the next was due outside
    for r in recs:
        assert r["lag_ms"] == pytest.approx((r["sent_s"] - r["scheduled_s"]) * 1e3, abs=1e-6)
    first = t["blocked"]
    if first["sent_s"] + first["end_s"] < window:  # its successor was due inside the window
        (late,) = [r for r in recs if r["worker"] == first["worker"]
                   and r["scheduled_s"] == first["sent_s"] + first["end_s"]]
        assert late["sent_s"] >= window and late["lag_ms"] >= 50.0  # sent late, and said so
    assert res["wall_s"] >= window  # every worker's last request ended after the window


def test_client_timing_is_the_stub_write_timing_plus_delivery():
    """Against a server whose timing is known (a 100 ms "prefill", then a token every 20 ms,
    each write time recorded by the stub): every chunk's arrival follows its write by a small
    delivery delay, TTFT spans the prefill, and TPOT / ITL are the stub's own pace to within
    the spread of those delays — whatever the scheduler does, since both clocks are one."""
    n = 10
    with StubThread(gap_s=0.02, ttft_s=0.1) as stub:
        t0 = time.perf_counter()

        async def go():
            async with CompletionClient(stub.base_url, "stub", timeout_s=10.0) as c:
                return await run_level(c, lambda i: "fine", phase="sweep", level=1, concurrency=1,
                                       max_tokens=n, t0=t0, n_requests=3)

        res = run(go())
        writes = stub.writes
    recs = sorted(res["records"], key=lambda r: r["i"])
    assert len(recs) == len(writes) == 3
    itl_client, itl_stub, timing = [], [], []
    for r, w in zip(recs, writes):
        sent = t0 + r["sent_s"]
        arrivals = [sent + c for c in r["chunk_s"]]
        timing.append((w, arrivals))
        delays = [a - x for a, x in zip(arrivals, w)]
        assert len(w) == len(arrivals) == n == r["output_tokens"]
        assert all(d >= 0 for d in delays), delays  # after the write (how soon: the machine's)
        assert r["ttft_s"] == pytest.approx(arrivals[0] - sent) and r["ttft_s"] >= 0.1
        stub_tpot = (w[-1] - w[0]) / (n - 1)
        assert stub_tpot >= 0.02
        assert abs(r["tpot_s"] - stub_tpot) <= (max(delays) - min(delays)) / (n - 1) + 1e-9
        # including TTFT (e2e / (n − 1)) would be ≥ 11 ms off: the definition is exact
        assert r["e2e_s"] / (n - 1) - r["tpot_s"] > 0.01
        itl_client += [b - a for a, b in zip(arrivals, arrivals[1:])]
        itl_stub += [b - a for a, b in zip(w, w[1:])]
    spread = max(abs(c - s) for c, s in zip(itl_client, itl_stub))
    f = level_figures(res["records"], res["wall_s"], max_client_lag_ms=1e9)
    assert f["itl_ms_p50"] == pytest.approx(sorted(itl_stub)[len(itl_stub) // 2] * 1e3,
                                            abs=spread * 1e3 + 1e-6)
    burst_s = 0.1 * f["stall_ref_step_ms"] / 1e3
    if not any(burst_possible(w, a, burst_s) for w, a in timing):  # else a stall would be real
        assert f["delivery_stalls"] == 0


def test_fixed_gap_gives_tpot_and_itl_equal_to_the_gap_and_ttft_the_first_delay():
    """An independent check of the definitions, not against the client's own arithmetic: a
    server that waits 50 ms, then streams a token every 10 ms. Median TPOT and ITL are never
    below the 10 ms pace (within 0.5 ms) and TTFT never below the 50 ms delay; how far above
    is the machine's load (the round trip to GET /health is printed with a failure)."""
    with StubThread(gap_s=0.010, ttft_s=0.050) as stub:
        async def go():
            async with CompletionClient(stub.base_url, "stub", timeout_s=10.0) as c:
                rtt = []
                for _ in range(8):
                    t = time.perf_counter()
                    await c.http.get("/health")
                    rtt.append(time.perf_counter() - t)
                res = await run_level(c, lambda i: "fine", phase="sweep", level=1, concurrency=1,
                                      max_tokens=12, t0=time.perf_counter(), n_requests=8)
                return res, min(rtt) * 1e3

        res, rtt_ms = run(go())
    f = level_figures(res["records"], res["wall_s"], max_client_lag_ms=1e9)
    assert f["completed"] == 8
    # the stub cannot stream faster than its pace, nor answer before its delay; how much
    # slower a busy machine makes the delivery is the scheduler's (the exact figures are checked
    # against the stub's own write times in test_client_timing_is_the_stub_write_timing_…)
    assert f["tpot_ms_p50"] >= 10.0 - 0.5 and f["itl_ms_p50"] >= 10.0 - 0.5
    ttft_ms = [r["ttft_s"] * 1e3 for r in res["records"]]
    assert min(ttft_ms) >= 50.0, (ttft_ms, rtt_ms)


def test_each_request_asks_for_its_own_lengths_and_its_record_says_which(stub):
    """A prompt source giving (text, prompt tokens, max_tokens): each request's max_tokens is
    sent (the stub streams exactly that many) and both lengths are in its record; the level's
    shape figures and mismatch counts are over those, by hand."""
    from k25exp.load.client import run_open_level

    shapes = {i: (f"p{i}", 10 + i, 2 + i) for i in range(6)}

    async def go():
        async with CompletionClient(stub.base_url, "stub", timeout_s=10.0) as c:
            closed = await run_level(c, shapes.__getitem__, phase="sweep", level=2, concurrency=2,
                                     max_tokens=99, t0=time.perf_counter(), n_requests=6,
                                     input_tokens=999)
            opened = await run_open_level(c, shapes.__getitem__, phase="sweep", level=1.0,
                                          due_s=[0.0] * 6, max_tokens=99, t0=time.perf_counter())
            plain = await run_level(c, lambda i: "fine", phase="sweep", level=1, concurrency=1,
                                    max_tokens=3, t0=time.perf_counter(), n_requests=1, input_tokens=7)
            return closed, opened, plain

    closed, opened, plain = asyncio.run(go())
    for res in (closed, opened):
        recs = sorted(res["records"], key=lambda r: r["i"])
        assert [(r["prompt_tokens_target"], r["max_tokens"]) for r in recs] == [
            (10 + i, 2 + i) for i in range(6)]
        assert [r["usage"]["completion_tokens"] for r in recs] == [2 + i for i in range(6)]
        f = level_figures(res["records"], res["wall_s"], target_output=99, target_input=999)
        assert f["output_tokens_mismatch"] == 0  # against each request's own max_tokens
        assert (f["output_len_mean"], f["output_len_min"], f["output_len_max"]) == (4.5, 2, 7)
        assert (f["input_len_mean"], f["input_len_min"], f["input_len_max"]) == (12.5, 10, 15)
        assert f["output_len_std"] == pytest.approx((17.5 / 6) ** 0.5)  # ddof 0 of 2 … 7
    (r,) = plain["records"]  # a text alone: the phase's own lengths, as before
    assert (r["prompt_tokens_target"], r["max_tokens"], r["usage"]["completion_tokens"]) == (7, 3, 3)
