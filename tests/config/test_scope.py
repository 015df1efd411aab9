"""The server group is part of the experiments that drive a server only (real compose of the
real conf/), and a server setting given to another experiment is refused by name."""

from __future__ import annotations

import pytest

from k25exp.config.experiments import EXPERIMENT_SCHEMAS
from k25exp.config.scope import missing_part_error, override_key, phase_keys, phase_paths
from k25exp.config.validate import to_typed
from tests.conftest import compose_cfg

# The experiments whose runners talk to a vLLM server (k25exp/runners/server_run.py's users)
SERVING = {"macro", "profile", "slo_search", "spec_decode", "spec_profile"}


@pytest.mark.parametrize("name", sorted(EXPERIMENT_SCHEMAS))
def test_only_the_serving_experiments_compose_a_server(name):
    keys = phase_keys(name)
    assert ("server" in keys) == (name in SERVING), sorted(keys)
    assert {"model", "hardware", "tracking", "paths", "experiment"} <= keys  # what every job has


def test_phase_paths_are_every_dotted_key_the_experiment_composes():
    macro, burst, profile = phase_paths("macro"), phase_paths("nccl_burst"), phase_paths("profile")
    # MacroConfig's own key, the server's keys (a mapping, a list, a null leaf), its parents
    assert {"experiment", "experiment.input_tokens", "experiment.slo.ttft_ms", "server",
            "server.port", "server.env", "server.extra_args", "server.base_url",
            "server.tokenizer", "model.quant.bits"} <= macro
    # null on macro, a mapping on profile: a key both have, what is in it profile's alone
    assert "server.profiler" in macro and "server.profiler.profiler" not in macro
    assert {"server.profiler", "server.profiler.profiler", "experiment.input_tokens"} <= profile
    assert "experiment.tokens" in burst
    assert not {p for p in burst if p == "server" or p.startswith("server.")}
    assert "experiment.input_tokens" not in burst
    assert phase_keys("nccl_burst") == {p for p in burst if "." not in p}


def test_a_collective_job_has_no_server_and_binds_its_ranks_as_the_server_would():
    cfg = compose_cfg("experiment=nccl_burst", "hardware.cpu_threads_bind=0|1")
    assert cfg.server is None and "server" not in str(cfg.experiment)
    assert to_typed(cfg, gpu_count=lambda: 0).hardware.cpu_threads_bind == "0|1"
    served = compose_cfg("experiment=macro", "hardware.cpu_threads_bind=0|1")
    assert served.server.cpu_threads_bind == "0|1"  # one setting for both (vllm.yaml follows it)


def test_the_server_group_is_chosen_and_set_as_before_on_a_serving_experiment():
    cfg = compose_cfg("experiment=macro", "server=endpoint", "server.base_url=http://gpu-box:8000")
    assert cfg.server.kind == "endpoint" and cfg.server.base_url == "http://gpu-box:8000"
    prof = compose_cfg("experiment=profile", "server.port=0")
    assert prof.server.kind == "vllm" and prof.server.port == 0
    assert prof.server.profiler.profiler == "torch"  # the experiment's own server settings kept


@pytest.mark.parametrize("arg,key", [
    ("server.port=1", "server"), ("server=endpoint", "server"), ("+server.x=1", "server"),
    ("++server.y=2", "server"), ("~server", "server"), ("server@foo=x", "server"),
    ("model=kimi_k25_int4", "model"), ("experiment.tokens=1,8", "experiment"),
    ("hydra.sweep.dir=/x", None), ("hydra/launcher=joblib", None), ("-m", None), ("--cfg", None),
])
def test_override_key_is_the_top_level_key_an_override_sets(arg, key):
    assert override_key(arg) == key


def test_a_server_setting_on_an_experiment_without_one_is_refused_by_name():
    why = missing_part_error(["experiment=nccl_burst", "debug=quick", "server.port=1"])
    assert why is not None
    assert why.startswith("server.port=1: experiment=nccl_burst has no server")
    assert "macro, profile, slo_search, spec_decode, spec_profile" in why  # where the group is
    # a sweep over experiments: the one without a server is named
    why = missing_part_error(["-m", "experiment=macro,gemm", "server=endpoint"])
    assert why is not None and why.startswith("server=endpoint: experiment=gemm has no server")
    assert missing_part_error(["experiment=macro", "server.port=1"]) is None
    assert missing_part_error(["experiment=nccl_burst", "experiment.tokens=8"]) is None
    # adding the group on purpose (+server=...) is the user's choice, not refused here
    assert missing_part_error(["experiment=gemm", "+server=vllm"]) is None
