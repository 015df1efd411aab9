"""The ITL tail by cause from the client's records alone (k25exp.load.tail_client): on
hand-written records whose causes are known, and against the engine stub whose injected
delays the trace-based decomposition is tested on (tests/traces/test_tail_causes.py)."""

from __future__ import annotations

import pytest

from k25exp.load import stalls
from k25exp.load.tail_client import FROM_TRACE, agreement, client_tail
from tests.traces import test_tail_causes as stub_scenario


def rec(i: int, sent_ms: float, arrive_ms: list[float], prompt: int = 16) -> dict:
    return {"i": i, "ok": True, "sent_s": sent_ms / 1e3,
            "chunk_s": [(a - sent_ms) / 1e3 for a in arrive_ms],
            "chunk_tokens": [1] * len(arrive_ms), "prompt_tokens": prompt}


def steps(a: float, b: float, off: float) -> list[float]:
    return [t + off for t in range(int(a), int(b) + 1, 10)]


# Three requests decode every 10 ms. 50 → 120: everyone waits (the engine paused). 130 → 200:
# everyone waits and a fourth request's first token ends it (its prefill: 100 prompt tokens).
# Request 1 misses 211 → 261 while the others keep getting tokens; request 2's 272 → 332 ends
# in a burst (332, 332.1, 332.2: held back).
R0 = rec(0, 0, steps(10, 50, 0) + steps(120, 130, 0) + steps(200, 340, 0))
R1 = rec(1, 0, steps(10, 50, 1) + steps(120, 130, 1) + steps(200, 210, 1) + steps(260, 340, 1))
R2 = rec(2, 0, steps(10, 50, 2) + steps(120, 130, 2) + steps(200, 270, 2) + [332, 332.1, 332.2, 342])
R3 = rec(3, 135, steps(200, 350, 0), prompt=100)


def test_each_cause_named_from_the_other_requests_by_hand():
    t = client_tail([R0, R1, R2, R3], threshold_ms=25, prefill_us_per_token=500)
    got = {(g.request, g.chunk): g for g in t.gaps}
    assert {k: g.cause for k, g in got.items()} == {
        (0, 5): "engine", (1, 5): "engine", (2, 5): "engine",
        (0, 7): "prefill", (1, 7): "prefill", (2, 7): "prefill",
        (1, 9): "skipped", (2, 15): "delivery"}
    p50 = t.p50_ms
    # the prefill's 100 tokens at 500 µs each: 50 ms of the 70 ms gap's excess, the rest engine
    g = got[(0, 7)]
    assert (g.parts["prefill"], g.parts["engine"]) == pytest.approx((50.0, 70 - p50 - 50))
    assert (got[(1, 9)].others, got[(1, 9)].progressed) == (3, 3)
    assert got[(2, 15)].parts["delivery"] == pytest.approx(60 - p50)
    m = t.metrics()
    assert m["tail_client.gaps"] == 8 and m["tail_client.cause.engine_gaps"] == 3
    assert "tail_client.itl_ms_p99" not in m  # fewer than 100 gaps


def test_without_a_threshold_below_a_p99_the_tail_is_the_stalls():
    recs = [dict(r) for r in (R0, R1, R2, R3)]
    stalls.mark(recs, step_s=0.01)
    t = client_tail(recs)
    assert t.p99_ms is None and "a p99 needs 100" in t.notes[0]
    assert [(g.request, g.chunk, g.cause) for g in t.gaps] == [(2, 15, "delivery")]
    assert client_tail([rec(9, 0, [5.0])]) is None  # one chunk: no gap


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    return stub_scenario.capture(tmp_path_factory.mktemp("trace"))


def test_the_injected_causes_as_the_client_alone_can_name_them(captured):
    """The stub's slow step and host gap are both `engine` here (a trace tells them apart),
    the skipped request `skipped`, the held one `delivery`, the burst of prefills `prefill`."""
    stub, recs, _, _ = captured
    want = stub_scenario.expected(stub)
    t = client_tail(recs, threshold_ms=stub_scenario.THRESHOLD_MS)
    assert {(g.request, g.chunk): g.cause for g in t.gaps} == {k: FROM_TRACE[c] for k, c in want.items()}
    assert agreement(t, want) == (len(want), len(want))
