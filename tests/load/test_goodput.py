"""Goodput on every load shape, from hand-built records (every expectation counted by hand):
requests of different lengths, a trace's 1-token answers, and a session's turns, each judged
from its own scheduled send."""

from __future__ import annotations

import pytest

from k25exp.load.level_figures import goodput, session_goodput


def _rec(ttft, e2e, out, ok=True, wait=0.0, **extra):
    """A request's record as the client leaves it (k25exp.load.client.finish): TPOT only with
    2 output tokens or more."""
    tpot = (e2e - ttft) / (out - 1) if out > 1 else None
    return {"ok": ok, "ttft_s": ttft, "e2e_s": e2e, "tpot_s": tpot, "output_tokens": out,
            "ttft_sched_s": ttft + wait, "e2e_sched_s": e2e + wait, **extra}


def test_a_one_token_answer_meets_any_tpot_bound_as_in_vllm():
    # A length distribution or a trace that draws a 1-token answer: no decode step, no TPOT.
    # vLLM's --goodput takes that TPOT as 0 (benchmarks/serve.py: "if output_len <= 1, we
    # regard tpot as 0 for goodput"), so such a request is good under any TPOT bound.
    recs = [_rec(0.05, 0.05, 1),          # 1 token: TPOT none → meets 10 ms
            _rec(0.05, 0.35, 11),         # TPOT (0.35 − 0.05) / 10 = 30 ms: misses 10 ms
            _rec(0.05, 0.10, 11),         # TPOT 5 ms: meets
            _rec(0.05, 0.05, 1, ok=False)]  # failed: never good, whatever its lengths
    g = goodput(recs, wall_s=2.0, slo={"tpot_ms": 10})
    # good: the 1-token one and the 11-token one at 5 ms: 2 of 4, 1 + 11 = 12 tokens over 2 s
    assert g == {"goodput_req_s": 1.0, "goodput_tok_s": 6.0, "good_fraction": 0.5}
    # the TTFT bound still judges the 1-token request: 50 ms from the scheduled send misses 40
    assert goodput(recs, 2.0, {"tpot_ms": 10, "ttft_ms": 40})["good_fraction"] == 0.0


def test_each_request_of_a_length_distribution_is_judged_on_its_own_lengths():
    # drawn lengths 4, 8, 16 output tokens, each decoding at 20 ms a token after a 100 ms TTFT:
    # E2E = 0.1 + 0.02 (n − 1) = 0.16, 0.24, 0.40 s; a 300 ms E2E bound keeps the two short ones
    recs = [_rec(0.1, 0.1 + 0.02 * (n - 1), n, prompt_tokens_target=p, max_tokens=n)
            for n, p in ((4, 900), (8, 100), (16, 500))]
    g = goodput(recs, wall_s=1.0, slo={"e2e_ms": 300})
    assert g["good_fraction"] == pytest.approx(2 / 3)
    assert g["goodput_tok_s"] == 12.0  # 4 + 8 tokens of the good ones, not 2 × the mean 9.33


def test_a_sessions_turn_is_judged_from_its_own_scheduled_send_not_the_sessions_start():
    # Two sessions of 3 turns, 1 s of think time before turns 2 and 3. Each turn's
    # ttft_sched_s counts from its scheduled send: the end of the answer before it + the think
    # time (k25exp.load.sessions), so the think time is never in it. Session 0: TTFTs 0.1,
    # 0.2, 0.3 s; session 1: 0.1, 0.6 (turn 2 late), 0.2. Counted from the session's start,
    # turn 2 would be ≥ 1 s + the first answer, and no later turn could meet 500 ms.
    def turn(s, t, ttft):
        return _rec(ttft, ttft + 0.1, 6, session=s, turn=t, think_s=0.0 if t == 1 else 1.0)

    recs = [turn(0, 1, 0.1), turn(0, 2, 0.2), turn(0, 3, 0.3),
            turn(1, 1, 0.1), turn(1, 2, 0.6), turn(1, 3, 0.2)]
    slo = {"ttft_ms": 500}
    g = goodput(recs, wall_s=3.0, slo=slo)
    assert g["good_fraction"] == pytest.approx(5 / 6)  # every turn but session 1's second
    assert g["goodput_req_s"] == pytest.approx(5 / 3)  # turns per second, 5 over 3 s
    # a session is good when all its turns were: session 0 only
    assert session_goodput(recs, 3, slo) == {"good_session_fraction": 0.5}
    # a session cut after its first turn (a failed turn ends it) is not good, however fast
    cut = recs[:3] + [turn(1, 1, 0.1)]
    assert session_goodput(cut, 3, slo) == {"good_session_fraction": 0.5}
    assert session_goodput(recs, 3, {}) == {} and session_goodput([_rec(0.1, 0.2, 3)], 3, slo) == {}
