"""experiment.input_len / output_len and experiment.trace (k25exp.config.experiments.
request_shapes): their defaults keep a run's meaning, and every impossible value names its key."""

from __future__ import annotations

import pytest

from k25exp.config.experiments.request_shapes import LengthConfig
from k25exp.config.validate import ConfigError, to_typed
from tests.conftest import compose_cfg


def typed(*overrides, experiment="macro"):
    return to_typed(compose_cfg(f"experiment={experiment}", *overrides), gpu_count=lambda: 0)


def problems(*overrides, experiment="macro") -> str:
    with pytest.raises(ConfigError) as e:
        typed(*overrides, experiment=experiment)
    return str(e.value)


def test_the_defaults_are_the_fixed_shape_of_input_tokens_and_output_tokens():
    e = typed().experiment
    assert e.input_len == LengthConfig() == e.output_len and e.input_len.dist == "fixed"
    assert (e.input_tokens, e.output_tokens, e.load) == (128, 64, "closed")
    assert e.trace.path is None and e.trace.speedup == [1.0] and e.trace.block_tokens == 512


def test_bad_shapes_name_their_keys_and_values(tmp_path):
    msg = problems("experiment.input_len.dist=zipf", "experiment.output_len.dist=uniform",
                   "experiment.output_len.range_ratio=1.5", "experiment.input_tokens=-5")
    assert ("experiment.input_len.dist='zipf': expected one of fixed, uniform, normal, lognormal, "
            "empirical") in msg
    assert "experiment.output_len.range_ratio=1.5: expected 0 <= x < 1" in msg
    assert "experiment.input_tokens=-5: expected a positive number" in msg  # the mean
    msg = problems("experiment.input_len.dist=normal", "experiment.input_len.stddev=-1",
                   "experiment.output_len.dist=lognormal", "experiment.output_len.sigma=-0.5",
                   "experiment.output_len.min=0", "experiment.input_len.max=0")
    for text in ("experiment.input_len.stddev=-1.0: expected >= 0 tokens",
                 "experiment.output_len.sigma=-0.5: expected >= 0",
                 "experiment.output_len.min=0: expected >= 1",
                 "experiment.input_len.max=0: expected >= experiment.input_len.min=1"):
        assert text in msg, text
    msg = problems("experiment.input_len.dist=empirical", "experiment.output_len.dist=empirical",
                   f"experiment.output_len.path={tmp_path / 'nope.txt'}")
    assert "experiment.input_len.path=null with experiment.input_len.dist=empirical" in msg
    assert f"experiment.output_len.path={str(tmp_path / 'nope.txt')!r}: no such file" in msg


def test_the_longest_draw_is_held_against_max_model_len():
    # uniform around 400 with ratio 0.5 reaches ceil(600) = 600; + 64 = 664 > 512
    msg = problems("server.max_model_len=512", "experiment.input_tokens=400",
                   "experiment.input_len.dist=uniform", "experiment.input_len.range_ratio=0.5")
    assert "600 + 64 = 664, exceeds server.max_model_len=512" in msg
    # a max bounds it: 440 + 64 fits
    typed("server.max_model_len=512", "experiment.input_tokens=400", "experiment.input_len.dist=uniform",
          "experiment.input_len.range_ratio=0.5", "experiment.input_len.max=440")
    # a fixed shape keeps its message
    assert "experiment.input_tokens + output_tokens = 576 exceeds server.max_model_len=512" in problems(
        "server.max_model_len=512", "experiment.input_tokens=512")


def test_a_trace_replay_needs_its_file_and_positive_distinct_speedups(tmp_path):
    msg = problems("experiment.load=trace")
    assert "experiment.trace.path=null with experiment.load=trace: expected a trace file" in msg
    msg = problems("experiment.load=trace", f"experiment.trace.path={tmp_path / 'none.jsonl'}",
                   "experiment.trace.speedup=[1,1]", "experiment.trace.block_tokens=0",
                   "experiment.duration_s=5", "experiment.prefix_tokens=16")
    for text in (f"experiment.trace.path={str(tmp_path / 'none.jsonl')!r}: no such file",
                 "experiment.trace.speedup=[1.0, 1.0]: factors must be distinct",
                 "experiment.trace.block_tokens=0: expected >= 1",
                 "experiment.duration_s=5.0 with experiment.load=trace: the trace says what is sent",
                 "experiment.prefix_tokens=16 with experiment.load=trace"):
        assert text in msg, text
    f = tmp_path / "t.jsonl"
    f.write_text('{"timestamp": 0, "input_length": 10, "output_length": 4}\n')
    assert "experiment.trace.speedup=[0.0, 2.0]: expected a non-empty list of factors > 0" in problems(
        "experiment.load=trace", f"experiment.trace.path={f}", "experiment.trace.speedup=[0,2]")
    e = typed("experiment.load=trace", f"experiment.trace.path={f}", "experiment.trace.speedup=[0.5,2]").experiment
    assert e.step_axis() == "speedup" and e.step_label(500) == "0.5"
    assert "experiment.load='poisson': expected closed, open, trace or sessions" in problems("experiment.load=poisson")


def test_an_slo_search_over_a_traces_speedup_runs_the_trace(tmp_path):
    f = tmp_path / "t.jsonl"
    f.write_text('{"timestamp": 0, "input_length": 10, "output_length": 4}\n')
    slo = "experiment.slo.ttft_ms=500"
    e = typed(slo, "experiment.search_over=speedup", "experiment.load=trace",
              f"experiment.trace.path={f}", experiment="slo_search").experiment
    assert e.search_over == "speedup" and e.load == "trace"
    assert ("experiment.load='open' with search_over=speedup: a rate search runs the open loop "
            "(load=open), a concurrency search the closed loop or multi-turn sessions (load=closed "
            "or sessions: workers or sessions in flight), a speedup search a trace (load=trace)") in problems(
        slo, "experiment.search_over=speedup", experiment="slo_search")
    assert "experiment.search_over='tokens': expected rate, concurrency or speedup" in problems(
        slo, "experiment.search_over=tokens", experiment="slo_search")


def test_spec_decode_refuses_a_trace_replay(tmp_path):
    f = tmp_path / "t.jsonl"
    f.write_text('{"timestamp": 0, "input_length": 10, "output_length": 4}\n')
    assert "experiment.load=trace: spec_decode measures a closed or an open loop" in problems(
        "experiment.load=trace", f"experiment.trace.path={f}", experiment="spec_decode")


def test_sessions_default_to_three_turns_without_think_time_one_session_per_worker_at_least():
    s = typed().experiment.sessions
    assert (s.turns, s.think_time_s, s.think_dist, s.count) == (3, 0.0, "fixed", None)
    # null count: max(concurrency, ceil(the level's requests / turns))
    assert s.per_level(concurrency=1, requests=8) == 3  # ceil(8 / 3)
    assert s.per_level(concurrency=16, requests=64) == 22  # ceil(64 / 3) = 22 >= 16
    assert s.per_level(concurrency=32, requests=8) == 32
    e = typed("experiment.load=sessions", "experiment.sessions.count=5",
              "experiment.concurrency=[1,4]").experiment
    assert e.sessions.per_level(4, e.requests_for(4)) == 5
    assert e.step_axis() == "c" and e.step_of(4) == 4 and e.max_in_flight() == 4
    assert e.sweep_levels() == [1, 4]


def test_bad_session_settings_name_their_keys():
    msg = problems("experiment.load=sessions", "experiment.sessions.turns=0",
                   "experiment.sessions.think_time_s=-1", "experiment.sessions.think_dist=gamma",
                   "experiment.sessions.count=0", "experiment.duration_s=5",
                   "experiment.client_processes=2")  # sessions run over client processes too
    for text in ("experiment.sessions.turns=0: expected >= 1",
                 "experiment.sessions.think_time_s=-1.0: expected >= 0 seconds",
                 "experiment.sessions.think_dist='gamma': expected fixed or exponential",
                 "experiment.sessions.count=0: expected >= 1 or null",
                 "experiment.duration_s=5.0 with experiment.load=sessions: a level runs "
                 "experiment.sessions.count sessions"):
        assert text in msg, text
    assert "client_processes" not in msg
    assert "experiment.load='poisson': expected closed, open, trace or sessions" in problems(
        "experiment.load=poisson")
    # the session keys are only checked where sessions are sent
    typed("experiment.sessions.turns=0")


def test_a_sessions_last_turn_and_its_answer_are_held_against_max_model_len():
    # 3 turns of (a 100-token message + a 64-token answer): the last turn's prompt holds 3
    # messages and 2 answers, + its own answer = 3 × 164 = 492 > 480
    msg = problems("experiment.load=sessions", "server.max_model_len=480",
                   "experiment.input_tokens=100")
    assert ("experiment.sessions.turns=3 × (the longest message + answer, 100 + 64) = 492 tokens "
            "(a session's last prompt and its answer) exceeds server.max_model_len=480") in msg
    typed("experiment.load=sessions", "server.max_model_len=492", "experiment.input_tokens=100")
    typed("server.max_model_len=480", "experiment.input_tokens=100")  # one turn: 164 fits


def test_spec_decode_refuses_sessions():
    assert "experiment.load=sessions: spec_decode measures a closed or an open loop" in problems(
        "experiment.load=sessions", experiment="spec_decode")
