"""experiment=macro and the server group compose, validate and fail like the other experiments."""

from __future__ import annotations

import pytest
from hydra.errors import ConfigCompositionException

from k25exp.config.experiments import MacroConfig
from k25exp.config.validate import ConfigError, to_typed
from tests.conftest import compose_cfg


def typed(*overrides):
    return to_typed(compose_cfg(*overrides), gpu_count=lambda: 0)


def test_embedded_default_is_the_tiny_model_on_the_cpu_build_at_tp2():
    c = typed("experiment=macro")
    assert isinstance(c.experiment, MacroConfig) and c.model.name == "tiny_kimi"
    assert c.server.kind == "vllm" and c.server.tp == 2 and c.server.host == "127.0.0.1"
    assert c.server.base_url == "http://127.0.0.1:8000" and c.server.model_path is None
    assert c.server.served_model_name == "tiny_kimi" and c.server.dtype == "bfloat16"
    assert c.experiment.seed == c.seed and c.experiment.concurrency == [1, 2, 4, 8, 16, 32]
    # the GPU box's model wins over the experiment's default one
    assert typed("experiment=macro", "model=kimi_k25_int4",
                 "server.model_path=/ckpt").model.name == "kimi_k25_int4"


def test_typos_fail_at_compose_time():
    with pytest.raises(ConfigCompositionException):
        compose_cfg("experiment=macro", "server.prot=1")
    with pytest.raises(ConfigCompositionException):
        compose_cfg("experiment=macro", "experiment.concurency=[1]")


def test_impossible_values_name_their_keys():
    with pytest.raises(ConfigError) as e:
        typed("experiment=macro", "experiment.output_tokens=1", "experiment.concurrency=[1,0]",
              "server.max_model_len=64", "server.tp=3", "experiment.fault.kill_server_at_level=7")
    msg = str(e.value)
    for key in ("experiment.output_tokens=1", "experiment.concurrency=[1, 0]",
                "exceeds server.max_model_len=64", "server.tp=3 must divide",
                "experiment.fault.kill_server_at_level=7"):
        assert key in msg, key
    with pytest.raises(ConfigError, match=r"server.model_path=null with model 'kimi_k25_int4' "
                                          r"\(w4a16\).*set server.load_format=dummy \(got null\)"):
        typed("experiment=macro", "model=kimi_k25_int4")


def test_client_processes_and_event_loop_are_checked():
    c = typed("experiment=macro")
    assert c.experiment.client_processes == 0 and c.experiment.client_event_loop == "auto"
    with pytest.raises(ConfigError) as e:
        typed("experiment=macro", "experiment.client_processes=-1",
              "experiment.client_event_loop=trio")
    assert "experiment.client_processes" in str(e.value)
    assert "experiment.client_event_loop='trio': expected auto, asyncio or uvloop" in str(e.value)


def test_endpoint_needs_a_base_url_and_a_tokenizer():
    with pytest.raises(ConfigError, match="server.base_url"):
        typed("experiment=macro", "server=endpoint")
    with pytest.raises(ConfigError, match="server.tokenizer is required"):
        typed("experiment=macro", "server=endpoint", "server.base_url=http://gpu-box:8000")
    c = typed("experiment=macro", "server=endpoint", "server.base_url=http://gpu-box:8000",
              "server.tokenizer=/models/k2", "server.api_key_env=MY_KEY")
    assert c.server.kind == "endpoint" and c.server.api_key_env == "MY_KEY"


def test_only_the_experiments_that_drive_a_server_compose_the_server_group():
    assert typed("experiment=nccl_burst").server is None
    assert typed("experiment=macro").server.kind == "vllm"
