"""Multi-turn sessions (k25exp.load.sessions): each turn's prompt is the session's history
plus a new message, the pause before it seeded, and the per-turn figures grouped by turn.

The loop runs against a fake client that answers each request with known token ids after a
known time, so every prompt, every scheduled send and every figure is worked out here by hand.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from k25exp.config.experiments.request_shapes import LengthConfig, SessionConfig
from k25exp.load.client import finish
from k25exp.load.lengths import Lengths
from k25exp.load.prompts import PromptBuilder, count_tokens, load_tokenizer
from k25exp.load.sessions import SessionPlan, run_session_level, session_figures, think_times
from k25exp.serving.tiny_model import write_tokenizer


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tok")
    write_tokenizer(folder, 4096, seed=0)
    return load_tokenizer(str(folder))


def plan(tok, turns=3, think=0.0, dist="fixed", n_in=20, n_out=5, seed=11, shape=None):
    builder = PromptBuilder(tok, n_in, seed)
    inputs = Lengths(shape or LengthConfig(), n_in, seed, "input", low=builder.least())
    outputs = Lengths(LengthConfig(), n_out, seed, "output")
    return SessionPlan(tok, builder, inputs, outputs,
                       SessionConfig(turns=turns, think_time_s=think, think_dist=dist), seed)


class FakeClient:
    """Answers request k (in send order) with max_tokens ids 3000 + 10 k, 3000 + 10 k + 1, ...
    after `gap_s`; the first token `ttft_s` after the send. Fails the sends named in `fail`
    ((session, turn) pairs) with an HTTP 500."""

    def __init__(self, gap_s=0.02, ttft_s=0.005, fail=()):
        self.gap_s, self.ttft_s, self.fail = gap_s, ttft_s, set(fail)
        self.prompts: dict[tuple[int, int], list[int]] = {}
        self.answers: dict[tuple[int, int], list[int]] = {}

    async def complete(self, prompt, max_tokens, rec, t0, answer=None):
        sent = time.perf_counter()
        rec["sent_s"] = sent - t0
        rec["lag_ms"] = (rec["sent_s"] - rec["scheduled_s"]) * 1e3
        key = (rec["session"], rec["turn"])
        self.prompts[key] = list(prompt)
        await asyncio.sleep(self.gap_s)
        if key in self.fail:
            rec.update(status=500, error="HTTP 500: boom", chunk_s=[], chunk_tokens=[], usage=None,
                       malformed=0, done=False)
        else:
            k = len(self.answers)
            ids = [3000 + 10 * k + j for j in range(max_tokens)]
            self.answers[key] = ids
            answer.extend(ids)
            rec.update(status=200, error=None, chunk_s=[self.ttft_s, self.gap_s],
                       chunk_tokens=[1, max_tokens - 1], malformed=0, done=True,
                       usage={"prompt_tokens": len(prompt), "completion_tokens": max_tokens,
                              "total_tokens": len(prompt) + max_tokens})
        rec["end_s"] = time.perf_counter() - sent
        return finish(rec)


def run(client, p, **kw):
    args = dict(phase="sweep", level=2, concurrency=2, n_sessions=2, t0=time.perf_counter())
    return asyncio.run(run_session_level(client, p, **(args | kw)))


def test_think_times_are_fixed_or_drawn_per_session_from_the_seed():
    fixed = SessionConfig(turns=4, think_time_s=0.5)
    assert think_times(fixed, seed=7, session=3) == [0.5, 0.5, 0.5]  # before turns 2, 3, 4
    assert think_times(SessionConfig(turns=1, think_time_s=0.5), 7, 3) == []
    expo = SessionConfig(turns=4, think_time_s=2.0, think_dist="exponential")
    # session s's pauses: default_rng([seed, 2, s]).exponential(mean, turns - 1)
    want = np.random.default_rng([7, 2, 3]).exponential(2.0, 3)
    assert think_times(expo, 7, 3) == pytest.approx(list(want))
    assert think_times(expo, 7, 3) == think_times(expo, 7, 3)  # the same at every level
    assert think_times(expo, 7, 4) != think_times(expo, 7, 3)
    many = [x for s in range(2000) for x in think_times(expo, 7, s)]
    assert np.mean(many) == pytest.approx(2.0, rel=0.05)  # the mean asked for
    assert think_times(SessionConfig(turns=3, think_time_s=0.0, think_dist="exponential"), 7, 0) == [0, 0]


def test_a_sessions_messages_are_their_drawn_lengths_the_first_with_the_special_tokens(tok):
    p = plan(tok, n_in=20)
    first, second = p.message(0, 1), p.message(0, 2)
    overhead = count_tokens(tok, "")  # the BOS the tokenizer prepends
    # turn 1 is a prompt like any other: 20 tokens counting the BOS; a later message is 20
    # tokens of its own, appended after the history (no second BOS)
    assert len(first) == 20 and first[:overhead] == tok("")["input_ids"]
    assert len(second) == 20 and second[:overhead] != tok("")["input_ids"]
    assert p.message(1, 1) != first and p.message(0, 1) == first  # each session its own, fixed
    # lengths: session s's turn t is request index s × turns + t − 1 of input_len / output_len
    q = plan(tok, n_in=20, shape=LengthConfig(dist="uniform", range_ratio=0.5))
    drawn = np.random.default_rng([11, 0, 0]).integers(10, 31, size=256)  # [floor 10, ceil 30]
    assert [len(q.message(1, t)) for t in (1, 2, 3)] == list(drawn[3:6])
    assert q.index(1, 3) == 5 and p.max_tokens(1, 3) == 5


def test_each_turns_prompt_is_the_history_plus_the_answer_plus_the_new_message(tok):
    p = plan(tok, turns=3, n_in=20, n_out=5, think=0.05)
    client = FakeClient()
    res = run(client, p)
    recs = sorted(res["records"], key=lambda r: (r["session"], r["turn"]))
    assert [(r["session"], r["turn"], r["i"]) for r in recs] == [
        (0, 1, 0), (0, 2, 1), (0, 3, 2), (1, 1, 3), (1, 2, 4), (1, 3, 5)]
    for s in (0, 1):
        sent = [client.prompts[s, t] for t in (1, 2, 3)]
        assert sent[0] == p.message(s, 1)
        assert sent[1] == sent[0] + client.answers[s, 1] + p.message(s, 2)
        assert sent[2] == sent[1] + client.answers[s, 2] + p.message(s, 3)
        # 20; 20 + 5 + 20 = 45; 45 + 5 + 20 = 70: what vLLM's usage would count
        lv = [r for r in recs if r["session"] == s]
        assert [r["prompt_tokens_target"] for r in lv] == [20, 45, 70]
        assert [r["usage"]["prompt_tokens"] for r in lv] == [20, 45, 70]
        assert [r["max_tokens"] for r in lv] == [5, 5, 5]
        # a turn after the first is due its think time after the last one's answer ended
        for a, b in zip(lv, lv[1:]):
            assert b["think_s"] == 0.05
            assert b["scheduled_s"] == pytest.approx(a["sent_s"] + a["end_s"] + 0.05, abs=1e-9)
            assert b["sent_s"] - b["scheduled_s"] > -0.002  # not before it (the loop's 1 ms timer)
        assert lv[0]["think_s"] == 0.0
    assert len(res["records"]) == 6 and {r["level"] for r in recs} == {2}


def test_a_failed_turn_ends_its_session(tok):
    p = plan(tok, turns=3)
    client = FakeClient(fail={(0, 2)})
    res = run(client, p)
    by = {(r["session"], r["turn"]): r for r in res["records"]}
    # the history is broken after a failed turn: session 0 sends no turn 3
    assert sorted(by) == [(0, 1), (0, 2), (1, 1), (1, 2), (1, 3)]
    assert not by[0, 2]["ok"] and by[1, 3]["ok"]
    figs = session_figures(res["records"], turns=3)
    assert (figs["sessions"], figs["sessions_completed"], figs["sessions_cut"]) == (2, 1, 1)


def test_sessions_of_a_later_repeat_are_numbered_on(tok):
    p = plan(tok, turns=2)
    client = FakeClient()
    res = run(client, p, first_session=4)
    assert sorted({r["session"] for r in res["records"]}) == [4, 5]
    assert client.prompts[4, 1] == p.message(4, 1)
    assert sorted(r["i"] for r in res["records"]) == [0, 1, 2, 3]  # the level's own indices


def rec(session, turn, ttft_s, ok=True, prompt=10, think=0.0):
    return {"session": session, "turn": turn, "ttft_s": ttft_s if ok else None, "ok": ok,
            "prompt_tokens_target": prompt, "think_s": think}


def test_per_turn_ttft_is_grouped_by_turn_with_its_sample_count():
    records = [rec(0, 1, 0.010, prompt=20), rec(1, 1, 0.030, prompt=20), rec(2, 1, 0.020, prompt=20),
               rec(0, 2, 0.100, prompt=45, think=1.0), rec(1, 2, 0.300, prompt=47, think=3.0),
               rec(2, 2, None, ok=False, prompt=46, think=2.0)]
    f = session_figures(records, turns=2)
    # turn 1: median of 10, 20, 30 ms; turn 2: of 100 and 300 (the failed one has none)
    assert f["turn1_ttft_ms_p50"] == pytest.approx(20.0) and f["turn1_ttft_ms_n"] == 3
    assert f["turn2_ttft_ms_p50"] == pytest.approx(200.0) and f["turn2_ttft_ms_n"] == 2
    assert f["turn1_ttft_ms_mean"] == pytest.approx(20.0) and f["turn2_ttft_ms_mean"] == pytest.approx(200.0)
    assert "turn1_ttft_ms_p99" not in f  # p99 needs 100 samples
    # the prompts sent, failed ones too: (45 + 47 + 46) / 3
    assert f["turn1_prompt_tokens_mean"] == 20.0 and f["turn2_prompt_tokens_mean"] == pytest.approx(46.0)
    assert f["think_s_mean"] == pytest.approx(2.0)  # (1 + 3 + 2) / 3, turns after the first
    assert (f["sessions"], f["sessions_completed"], f["sessions_cut"]) == (3, 2, 1)
    # 100 samples: p99 by linear interpolation, rank 0.99 × 99 = 98.01 between 99 and 100 ms
    many = session_figures([rec(s, 1, (s + 1) / 1e3) for s in range(100)], turns=1)
    assert many["turn1_ttft_ms_p99"] == pytest.approx(99.01) and many["turn1_ttft_ms_n"] == 100
    assert many["turn1_ttft_ms_p50"] == pytest.approx(50.5)
