"""experiment.validity (k25exp.config.experiments.validity): the client-lag rule by name, its
defaults, every bad value named with its key, and what a level's lag is held against."""

from __future__ import annotations

import pytest

from k25exp.config.experiments import MacroConfig, SloConfig, SloSearchConfig
from k25exp.config.experiments.validity import ValidityConfig
from k25exp.config.validate import ConfigError, to_typed
from tests.conftest import compose_cfg


def typed(*overrides, experiment="macro"):
    return to_typed(compose_cfg(f"experiment={experiment}", *overrides), gpu_count=lambda: 0)


def test_the_default_is_the_relative_rule_and_the_absolute_one_is_kept_by_name():
    e = typed().experiment
    assert e.validity == ValidityConfig(rule="relative", lag_frac=0.5, tail=0.01, min_late=2)
    assert e.max_client_lag_ms == 20.0  # the absolute rule's limit, unchanged
    e = typed("experiment.validity.rule=absolute").experiment
    assert e.validity.rule == "absolute"
    for name in ("spec_decode", "slo_search"):  # the family's other members carry it too
        assert typed(*(["experiment.slo.ttft_ms=500"] if name == "slo_search" else []),
                     experiment=name).experiment.validity.rule == "relative"


def test_bad_values_name_their_keys():
    with pytest.raises(ConfigError) as e:
        typed("experiment.validity.rule=p99", "experiment.validity.lag_frac=0",
              "experiment.validity.tail=1.5", "experiment.validity.min_late=0")
    msg = str(e.value)
    assert "experiment.validity.rule='p99': expected one of relative, absolute" in msg
    assert "experiment.validity.lag_frac=0.0: expected a fraction of the level's step > 0" in msg
    assert "experiment.validity.tail=1.5: expected a share of the sends, 0 <= x < 1" in msg
    assert "experiment.validity.min_late=0: expected >= 1 late sends" in msg


def test_a_level_is_held_against_its_step_an_slo_probe_against_the_slos_tightest_bound():
    assert MacroConfig().lag_reference() is None  # the level's own step (its ITL mean)
    probe = SloSearchConfig(slo=SloConfig(ttft_ms=500.0, e2e_ms=2000.0, tpot_ms=50.0), percentile=99)
    assert probe.lag_reference() == (50.0, "the SLO's p99 tpot_ms bound")
    assert SloSearchConfig(slo=SloConfig(ttft_ms=60.0)).lag_reference() == \
        (60.0, "the SLO's p90 ttft_ms bound")
