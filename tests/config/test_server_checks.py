"""The server group's checks hold for every experiment whose config has the group (found by
composing each registered experiment), once each, whichever experiment composed it: bad
server values stop the job before anything starts, in one message."""

from __future__ import annotations

import pytest

from k25exp.config.experiments import EXPERIMENT_SCHEMAS
from k25exp.config.scope import phase_keys
from k25exp.config.validate import ConfigError, to_typed
from tests.conftest import compose_cfg

# Every registered experiment whose config composes the server group (its file's defaults
# list `/server: vllm`), so a new one is covered as soon as it exists
WITH_SERVER = sorted(n for n in EXPERIMENT_SCHEMAS if "server" in phase_keys(n))


def typed(name: str, *overrides: str):
    """experiment=NAME, with what it cannot run without (its example_overrides), validated."""
    return to_typed(compose_cfg(f"experiment={name}", *EXPERIMENT_SCHEMAS[name].example_overrides,
                                *overrides), gpu_count=lambda: 0)


def test_the_experiments_with_a_server_are_found():
    assert {"macro", "profile", "spec_decode"} <= set(WITH_SERVER)  # the campaign's served phases
    assert "nccl_burst" not in WITH_SERVER


@pytest.mark.parametrize("name", WITH_SERVER)
def test_a_bad_port_and_context_stop_every_experiment_with_a_server(name):
    """The issue's command line: experiment=profile started vLLM, which died with a traceback
    in create_server_socket ("bind(): port must be 0-65535")."""
    typed(name)  # valid as it stands
    with pytest.raises(ConfigError) as e:
        typed(name, "server.port=99999", "server.max_model_len=-5")
    assert str(e.value) == ("invalid config:\n"
                            "  - server.max_model_len=-5: expected a positive number\n"
                            "  - server.port=99999: expected 0 (any free port) to 65535")


@pytest.mark.parametrize("name", WITH_SERVER)
def test_a_request_longer_than_the_context_is_refused(name):
    with pytest.raises(ConfigError) as e:  # 90 prompt + 20 generated tokens > 100
        typed(name, "experiment.input_tokens=90", "experiment.output_tokens=20",
              "server.max_model_len=100")
    assert str(e.value) == ("invalid config:\n  - experiment.input_tokens + output_tokens = 110 "
                            "exceeds server.max_model_len=100")
    typed(name, "experiment.input_tokens=80", "experiment.output_tokens=20",
          "server.max_model_len=100")  # 100 fits


@pytest.mark.parametrize("name", WITH_SERVER)
def test_an_endpoint_s_url_and_tokenizer_are_checked_once(name):
    with pytest.raises(ConfigError) as e:
        typed(name, "server=endpoint", "server.base_url=gpu-box:8000")
    msg = str(e.value)
    assert msg.count("server.base_url='gpu-box:8000': expected http://host:port") == 1, msg
    assert msg.count("server.tokenizer is required with server=endpoint") == 1, msg


@pytest.mark.parametrize("name", WITH_SERVER)
def test_tp_must_divide_the_heads_of_the_served_model(name):
    # tiny_kimi has 8 attention heads (conf/model/tiny_kimi.yaml)
    with pytest.raises(ConfigError) as e:
        typed(name, "server.tp=3")
    assert str(e.value).count("server.tp=3 must divide model.num_attention_heads=8") == 1


@pytest.mark.e2e
def test_the_command_line_stops_profile_before_vllm_starts(k25):
    r = k25("experiment=profile", "server.port=99999", "server.max_model_len=-5", seed=False)
    assert r.returncode == 2, r.stderr[-3000:]
    assert ("k25exp: invalid config:\n  - server.max_model_len=-5: expected a positive number\n"
            "  - server.port=99999: expected 0 (any free port) to 65535") in r.stderr
    assert "Traceback" not in r.stderr and not (r.outputs / "mlflow.db").exists()
