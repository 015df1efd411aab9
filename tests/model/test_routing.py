"""model.routing: its values, what it makes of null, and its expected distinct experts, each
checked against a count by hand."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from k25exp.model import routing


def model(r=None, experts=384):
    return SimpleNamespace(routing=r, n_routed_experts=experts)


def test_null_is_uniform_on_dummy_weights_of_a_moe_model_and_learned_otherwise():
    assert routing.effective(model(), "dummy") == "uniform"
    assert routing.effective(model(), None) == "learned"
    assert routing.effective(model(experts=0), "dummy") == "learned"  # no experts to route
    assert routing.effective(model("skewed"), None) == "skewed"
    assert routing.effective(model("learned"), "dummy") == "learned"  # what the user said
    assert routing.check("zipf") == ("model.routing='zipf': expected one of learned, uniform, "
                                     "skewed or null (auto)")
    assert routing.check(None) is None and routing.check("uniform") is None


def test_the_server_gets_vllms_simulator_strategy_unless_learned():
    assert routing.server_env("uniform") == {"VLLM_MOE_ROUTING_SIMULATION_STRATEGY": "uniform_random"}
    assert routing.server_env("skewed") == {"VLLM_MOE_ROUTING_SIMULATION_STRATEGY": "normal_routing"}
    assert routing.server_env("learned") == {}
    assert "untrained" in routing.warning("learned", "dummy", 384)
    assert routing.warning("uniform", "dummy", 384) is None and routing.warning("learned", None, 384) is None


def test_skewed_probabilities_by_hand():
    # E = 2: id 0 iff sigmoid(z) < 1/2 iff z < 0: one half each
    assert routing.skewed_probabilities(2) == pytest.approx([0.5, 0.5])
    # E = 4: id 0 iff z < logit(1/4) = -ln 3: Φ(-1.0986) = 0.13595 (normal table)
    p = routing.skewed_probabilities(4)
    assert p[0] == pytest.approx(0.13595, abs=1e-4) and p[3] == pytest.approx(p[0])
    assert p[1] == pytest.approx(0.5 - 0.13595, abs=1e-4) and sum(p) == pytest.approx(1.0)


def test_distinct_experts_by_hand():
    # one token takes k distinct experts under uniform; two tokens of top-1 of 2 experts:
    # 2 · (1 − (1/2)²) = 1.5
    assert routing.distinct_experts(1, 8, 384, "uniform") == pytest.approx(8)
    assert routing.distinct_experts(2, 1, 2, "uniform") == pytest.approx(1.5)
    # skewed, E = 2 (p = 1/2 each), 1 token of top-1: one draw, one expert
    assert routing.distinct_experts(1, 1, 2, "skewed") == pytest.approx(1.0)
    # 1 token of top-2 of 2 under skewed: two independent draws; both experts with prob 1/2
    assert routing.distinct_experts(1, 2, 2, "skewed") == pytest.approx(1.5)
    # hot experts: fewer distinct than uniform at every batch, Kimi's 384 experts, top-8
    for c in (1, 8, 32, 128):
        assert routing.distinct_experts(c, 8, 384, "skewed") < routing.distinct_experts(c, 8, 384, "uniform")
    u32 = 384 * (1 - (1 - 8 / 384) ** 32)
    assert routing.distinct_experts(32, 8, 384, "uniform") == pytest.approx(u32) and math.isclose(u32, 188.23, abs_tol=0.01)  # (47/48)^32 = 0.50981
