"""The client-lag rule (k25exp.load.validity) on hand-computed levels: relative to the level's
own step and count-aware, the absolute 20 ms rule kept by name, and the rule and its numbers
in the level's `why`."""

from __future__ import annotations

import pytest

from k25exp.config.experiments.validity import ValidityConfig
from k25exp.load.client import finish
from k25exp.load.level_figures import describe_invalid, invalid_reason, level_figures
from k25exp.load.validity import describe, judge

RELATIVE, ABSOLUTE = ValidityConfig(), ValidityConfig(rule="absolute")


def level(lags_ms: list[float], step_s: float = 0.04) -> list[dict]:
    """One request per send, each streaming 5 chunks `step_s` apart (ITL mean = the step)."""
    return [finish({"status": 200, "done": True, "lag_ms": lag,
                    "chunk_s": [0.1 + step_s * k for k in range(5)], "chunk_tokens": [1] * 5,
                    "usage": {"completion_tokens": 5, "prompt_tokens": 9}}) for lag in lags_ms]


def test_one_late_send_does_not_void_a_12_request_level_under_the_relative_rule():
    # 12 sends, one 25 ms late, the others 0.5 ms; a 40 ms step. Relative: late from
    # 0.5 x 40 = 20 ms, 1 send is, 1 is allowed (min_late 2; 1 % of 12 is 0.12) -> valid.
    # Absolute: under 100 sends the max is judged, 25 ms > 20 ms -> invalid (the old verdict).
    recs = level([0.5] * 11 + [25.0])
    f = level_figures(recs, wall_s=1.0, max_client_lag_ms=20.0, validity=RELATIVE)
    assert f["itl_ms_mean"] == pytest.approx(40.0)
    assert f["client_lag_ref_ms"] == pytest.approx(40.0)
    assert f["client_lag_limit_ms"] == pytest.approx(20.0)
    assert f["client_late_sends"] == 1.0
    assert f["client_lagged"] == 0.0 and f["valid"] == 1.0 and invalid_reason(f) == ""
    g = level_figures(recs, wall_s=1.0, max_client_lag_ms=20.0, validity=ABSOLUTE)
    assert g["client_lagged"] == 1.0 and g["valid"] == 0.0
    assert g["client_lag_limit_ms"] == 20.0 and g["client_late_sends"] == 1.0
    assert "client_lag_ref_ms" not in g
    assert invalid_reason(g) == ("client lag (absolute: send lag max of 12 25.0 ms, loop lag "
                                 "mean 0.0 ms; limit 20 ms)")
    # no rule given (direct callers, k25exp recover): the absolute one, as before
    assert level_figures(recs, wall_s=1.0, max_client_lag_ms=20.0)["client_lagged"] == 1.0


def test_a_second_late_send_voids_it_and_why_names_the_step_and_the_limit():
    recs = level([0.5] * 10 + [25.0, 21.0])
    f = level_figures(recs, wall_s=1.0, max_client_lag_ms=20.0, validity=RELATIVE)
    assert f["client_late_sends"] == 2.0 and f["client_lagged"] == 1.0 and f["valid"] == 0.0
    assert invalid_reason(f) == ("client lag (relative: 2 of 12 sends late by >= 20.0 ms = 0.5 x "
                                 "ITL mean 40.0 ms (1 allowed))")
    assert describe_invalid("level c=12", f).startswith(
        "level c=12 invalid: the client lagged (relative: 2 of 12 sends late by >= 20.0 ms")


def test_a_level_whose_p99_send_lag_is_half_its_step_is_invalid():
    # 100 sends: 98 at 0.5 ms, 2 at 20 ms; step 40 ms. p99 (linear, index 98.01) = 20 ms.
    # Relative: 2 sends at >= 20 ms, allowed max(2 - 1, floor(1 % x 100)) = 1 -> invalid.
    # Absolute: p99 20 ms is not above 20 ms -> valid (it held a 20 ms lag at any step).
    lags = [0.5] * 98 + [20.0, 20.0]
    m = {"client_lag_ms_p99": 20.0, "client_lag_ms_max": 20.0, "itl_ms_mean": 40.0}
    rel = judge(m, lags, RELATIVE, 20.0)
    assert (rel["client_lagged"], rel["client_late_sends"], rel["client_lag_limit_ms"]) == (1.0, 2.0, 20.0)
    assert rel["client_lag_rule"] == ("relative: 2 of 100 sends late by >= 20.0 ms = 0.5 x ITL "
                                      "mean 40.0 ms (1 allowed)")
    assert judge(m, lags, ABSOLUTE, 20.0)["client_lagged"] == 0.0
    # the same lags at a 46 ms step (H200, c = 256): late from 23 ms, none is
    assert judge({**m, "itl_ms_mean": 46.0}, lags, RELATIVE, 20.0)["client_lagged"] == 0.0


def test_a_large_level_lags_when_more_than_one_percent_of_its_sends_were_late():
    m = {"itl_ms_mean": 10.0}  # late from 5 ms
    assert judge(m, [6.0] * 10 + [0.1] * 990, RELATIVE, 20.0)["client_lagged"] == 0.0  # 10 = 1 %
    assert judge(m, [6.0] * 11 + [0.1] * 989, RELATIVE, 20.0)["client_lagged"] == 1.0  # 11 > 1 %
    # min_late and tail are the config's: one late send voids a level with min_late=1, tail=0
    strict = ValidityConfig(min_late=1, tail=0.0)
    assert judge(m, [6.0] + [0.1] * 11, strict, 20.0)["client_lagged"] == 1.0


def test_an_slo_probe_holds_the_lag_against_the_slos_bound_and_names_it():
    # 20 sends, 2 late by 25 ms, a 10 ms step: against the step (late from 5 ms) the probe
    # lagged; against a 60 ms TTFT bound (late from 30 ms) it did not
    m, lags = {"itl_ms_mean": 10.0}, [25.0, 25.0] + [0.2] * 18
    assert judge(m, lags, RELATIVE, 20.0)["client_lagged"] == 1.0
    bound = (60.0, "the SLO's p90 ttft_ms bound")
    v = judge(m, lags, RELATIVE, 20.0, bound)
    assert v["client_lagged"] == 0.0 and v["client_lag_limit_ms"] == 30.0 and v["client_lag_ref_ms"] == 60.0
    assert "0.5 x the SLO's p90 ttft_ms bound 60.0 ms" in v["client_lag_rule"]


def test_loop_lag_and_cpu_and_a_level_without_a_step():
    # the event loop's mean wake-up lag at half the step lags the level (absolute: not above 20)
    m = {"itl_ms_mean": 40.0, "client_loop_lag_ms_mean": 20.0}
    v = judge(m, [0.1] * 12, RELATIVE, 20.0)
    assert v["client_lagged"] == 1.0 and "loop lag mean 20.0 ms >= 20.0 ms" in v["client_lag_rule"]
    assert judge(m, [0.1] * 12, ABSOLUTE, 20.0)["client_lagged"] == 0.0
    # a busy client CPU lags a level under either rule
    for rule in (RELATIVE, ABSOLUTE):
        c = judge({"itl_ms_mean": 40.0, "client_cpu_util": 0.95}, [0.1] * 12, rule, 20.0)
        assert c["client_lagged"] == 1.0 and c["client_lag_rule"].endswith("client CPU above 90 % of a core")
    # no step measured (no request streamed two chunks): the absolute limit, and it says so
    n = judge({"client_lag_ms_max": 25.0}, [25.0], RELATIVE, 20.0)
    assert n["client_lagged"] == 1.0 and n["client_lag_rule"].startswith("no step measured: absolute:")


def test_the_run_tag_names_the_rule_and_its_constants():
    assert describe(ABSOLUTE, 20.0) == (
        "absolute: send lag p99 (its max under 100 sends) or mean loop lag above 20 ms "
        "(experiment.max_client_lag_ms); or client CPU above 90 % of a core")
    assert describe(RELATIVE, 20.0) == (
        "relative: a send late by >= 0.5 x the level's ITL mean (its step; where none: the "
        "absolute 20 ms); lagged when more than 1% of the level's sends and at least 2 were, "
        "or the mean loop lag reached it; or client CPU above 90 % of a core")
    assert "0.5 x the SLO's p90 ttft_ms bound (60 ms)" in describe(
        RELATIVE, 20.0, (60.0, "the SLO's p90 ttft_ms bound"))
