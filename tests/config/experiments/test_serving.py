"""k25exp.config.experiments.serving: what a level of the macro family is, on its schema (the
levels swept, a level's MLflow step and that step's label, the requests it is sent, the most
in flight), with values computed by hand from the defaults (rounds 4, min_requests 8)."""

from __future__ import annotations

import pytest

from k25exp.config.experiments import MacroConfig, ProfileConfig, SloSearchConfig, SpecDecodeConfig
from k25exp.config.experiments import serving
from k25exp.config.validate import to_typed
from tests.conftest import compose_cfg


def closed(**kw) -> MacroConfig:
    return MacroConfig(**kw)


def open_loop(**kw) -> MacroConfig:
    return MacroConfig(load="open", **kw)


def test_a_closed_levels_requests_are_four_rounds_of_its_workers_at_least_eight():
    exp = closed()
    # max(8, ceil(4 × c))
    assert [exp.requests_for(c) for c in (1, 2, 3, 4, 32)] == [8, 8, 12, 16, 128]
    assert closed(rounds=2, min_requests=1).requests_for(3) == 6


def test_an_open_levels_requests_are_four_seconds_of_its_arrivals_rounded_up():
    exp = open_loop()
    # max(8, ceil(4 s × rate)): 0.5/s -> 2 -> 8; 3.3/s -> 13.2 -> 14
    assert [exp.requests_for(r) for r in (0.5, 2.0, 3.3, 10.0)] == [8, 8, 14, 40]


def test_a_fixed_request_count_is_every_levels():
    exp = closed(requests=5)
    assert [exp.requests_for(c) for c in (1, 64)] == [5, 5]


def test_the_sweep_is_the_concurrencies_or_the_rates_cut_at_limit_points():
    assert closed().sweep_levels() == [1, 2, 4, 8, 16, 32]
    assert closed(limit_points=2).sweep_levels() == [1, 2]
    assert open_loop(request_rate=[0.5, 3.0, 7.25]).sweep_levels() == [0.5, 3.0, 7.25]
    assert open_loop(limit_points=1).sweep_levels() == [1.0]


def test_a_levels_step_is_its_concurrency_or_its_rate_times_1000():
    assert closed().step_of(8) == 8
    assert open_loop().step_of(0.5) == 500
    assert open_loop().step_of(7.25) == 7250
    assert open_loop().step_of(0.1 + 0.2) == 300  # 300.00000000000006: rounded, not cut


@pytest.mark.parametrize("exp, level, step, label", [
    (closed(), 1, 1, "1"),
    (closed(), 32, 32, "32"),
    (open_loop(), 0.5, 500, "0.5"),
    (open_loop(), 3.0, 3000, "3"),
    (open_loop(), 7.25, 7250, "7.25"),
])
def test_step_label_reads_back_the_level_step_of_gave(exp, level, step, label):
    assert exp.step_of(level) == step
    assert exp.step_label(step) == label
    assert float(label) == level


def test_the_most_in_flight_is_the_largest_concurrency_or_the_open_loops_cap():
    assert closed(concurrency=[4, 16, 2]).max_in_flight() == 16
    assert open_loop(max_concurrency=10).max_in_flight() == 10
    assert open_loop().max_in_flight() == serving.OPEN_LOOP_CAP == 256


def test_the_subclasses_inherit_the_rules_with_their_own_defaults():
    spec = SpecDecodeConfig()
    assert spec.sweep_levels() == [1, 2, 4] and spec.max_in_flight() == 4
    slo = SloSearchConfig()  # open loop, min_requests 20 per probe
    assert [slo.requests_for(r) for r in (4.0, 8.0)] == [20, 32]
    assert slo.step_of(0.125) == 125 and slo.step_label(125) == "0.125"


def test_the_typed_config_a_runner_gets_has_the_rules():
    exp = to_typed(compose_cfg("experiment=macro", "experiment.load=open",
                               "experiment.request_rate=[0.25,2]")).experiment
    assert isinstance(exp, MacroConfig)
    assert [exp.step_of(r) for r in exp.sweep_levels()] == [250, 2000]
    assert exp.requests_for(0.25) == 8


def test_the_profiles_reference_level_is_sent_as_the_macro_sends_one():
    # max(8, 4 rounds × concurrency)
    assert [ProfileConfig(concurrency=c).reference_requests() for c in (1, 3, 8)] == [8, 12, 32]
    assert ProfileConfig(concurrency=8).reference_requests() == MacroConfig().requests_for(8)
