"""model.routing reaches the real vLLM CPU server: its router's choice is replaced by vLLM's
routing simulator (VLLM_MOE_ROUTING_SIMULATION_STRATEGY), and the run says which routing it
measured. A job of its own (its own server: the routing is part of the launch key)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.xdist_group("servers")]


def test_uniform_routing_is_what_the_served_engine_runs(k25):
    r = k25("experiment=macro", "debug=quick", "model.routing=uniform", "server.port=0",
            "server.tp=1", "server.enforce_eager=true", "server.max_model_len=512",
            "experiment.concurrency=[2]", "experiment.output_tokens=8", timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    (run,) = [x for x in r.runs() if x.data.tags.get("k25exp.experiment") == "macro"]
    assert run.data.tags["routing"] == "uniform" and run.data.params["model.routing"] == "uniform"
    log = (Path(run.data.tags["k25exp.output_dir"]) / "server.log").read_text()
    # k25exp's launch header, then vLLM's own word that it replaced the router's choice
    assert "VLLM_MOE_ROUTING_SIMULATION_STRATEGY=uniform_random" in log.splitlines()[1]
    assert "Simulating MoE routing using a uniform_random strategy" in log
