"""k25exp.runners.macro_phases: a phase's figures are judged by the experiment's client-lag rule
(experiment.validity), against the level's own step or, for an SLO probe, the SLO's bound."""

from __future__ import annotations

import pytest

from k25exp.config.experiments import MacroConfig, SloConfig, SloSearchConfig
from k25exp.config.experiments.validity import ValidityConfig
from k25exp.runners.macro_phases import Phases
from tests.load.test_validity import level


def figures(exp: MacroConfig, lags_ms: list[float]) -> dict:
    """The client's figures of one phase whose sends were late by `lags_ms`, each request
    streaming chunks 40 ms apart (no server: only the judgement is exercised)."""
    ph = Phases(exp, conn=None, client=None, prompt=None, jsonl=None, progress=None, t0=0.0)
    return ph._client_figures({"records": level(lags_ms), "wall_s": 1.0, "cpu_s": 0.1,
                               "loop_lag_ms": [0.2] * 10})


def test_a_macro_level_is_judged_against_its_own_step():
    # 12 sends, two 25 ms late, at a 40 ms step: late from 20 ms, 2 > 1 allowed
    f = figures(MacroConfig(), [0.5] * 10 + [25.0, 25.0])
    assert f["client_lag_ref_ms"] == pytest.approx(40.0) and f["client_lagged"] == 1.0
    assert "0.5 x ITL mean 40.0 ms" in f["client_lag_rule"]
    # one of them: valid (the absolute rule, by name, voids it as before)
    assert figures(MacroConfig(), [0.5] * 11 + [25.0])["valid"] == 1.0
    old = figures(MacroConfig(validity=ValidityConfig(rule="absolute")), [0.5] * 11 + [25.0])
    assert old["valid"] == 0.0 and old["client_lag_limit_ms"] == 20.0


def test_an_slo_probe_is_judged_against_the_slos_bound():
    # the same two 25 ms sends against a 60 ms TTFT bound: late from 30 ms, none is
    probe = SloSearchConfig(slo=SloConfig(ttft_ms=60.0))
    f = figures(probe, [0.5] * 10 + [25.0, 25.0])
    assert f["client_lag_ref_ms"] == 60.0 and f["client_lag_limit_ms"] == 30.0
    assert f["client_lagged"] == 0.0 and "the SLO's p90 ttft_ms bound 60.0 ms" in f["client_lag_rule"]
