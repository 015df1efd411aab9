"""experiment=spec_decode: composition, the --speculative-config it builds, its errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from k25exp.config.experiments import SpecDecodeConfig
from k25exp.config.validate import ConfigError, to_typed
from k25exp.serving.speculative import self_draft_checkpoint, speculative_config
from tests.conftest import compose_cfg


def typed(*overrides):
    return to_typed(compose_cfg(*overrides), gpu_count=lambda: 0)


def test_both_bounds_compose_on_the_embedded_default(tmp_path):
    ngram = typed("experiment=spec_decode").experiment
    self_ = typed("experiment=spec_decode", "spec=self_draft").experiment
    assert isinstance(ngram, SpecDecodeConfig) and ngram.name == self_.name == "spec_decode"
    assert ngram.method == "ngram" and self_.method == "draft_model" and self_.concurrency == [1]
    spec = speculative_config(ngram, tmp_path, tmp_path)
    # acceptance is configuration by default: the server starts in synthetic mode at the first
    # α (α^(i+1) at position i: 0.5, 0.25, 0.125), the others are set between levels
    assert ngram.acceptance == "synthetic" and ngram.alphas == [0.5, 0.7, 0.9]
    assert spec == {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1,
                    "prompt_lookup_max": 4, "rejection_sample_method": "synthetic",
                    "synthetic_acceptance_rates": [0.5, 0.25, 0.125]}
    plain = typed("experiment=spec_decode", "experiment.acceptance=as_model").experiment
    assert "rejection_sample_method" not in speculative_config(plain, tmp_path, tmp_path)


def test_self_draft_is_the_same_weights_under_a_config_vllm_loads_as_a_plain_model(tmp_path):
    model = tmp_path / "tiny"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "deepseek_v3",
                                                   "architectures": ["DeepseekV3ForCausalLM"],
                                                   "hidden_size": 512}))
    (model / "model.safetensors").write_bytes(b"weights")
    exp = typed("experiment=spec_decode", "spec=self_draft", "experiment.num_speculative_tokens=5").experiment
    spec = speculative_config(exp, model, tmp_path / "cache")
    draft = Path(spec["model"])
    assert spec["method"] == "draft_model" and spec["num_speculative_tokens"] == 5
    cfg = json.loads((draft / "config.json").read_text())
    assert cfg["model_type"] == "deepseek_v2" and cfg["hidden_size"] == 512
    assert (draft / "model.safetensors").resolve() == (model / "model.safetensors").resolve()
    assert self_draft_checkpoint(model, tmp_path / "cache") == draft  # idempotent


def test_bad_settings_name_their_keys():
    with pytest.raises(ConfigError) as e:
        typed("experiment=spec_decode", "experiment.num_speculative_tokens=0",
              "experiment.prompt_lookup_min=5", "experiment.prompt_lookup_max=2",
              "+experiment.extra.method=eagle")
    msg = str(e.value)
    assert "experiment.num_speculative_tokens=0" in msg
    assert "prompt_lookup_min=5, prompt_lookup_max=2" in msg
    assert "experiment.extra sets ['method']" in msg
    with pytest.raises(ConfigError, match="experiment.draft_model=/nope"):
        typed("experiment=spec_decode", "experiment.method=draft_model", "experiment.draft_model=/nope")
    with pytest.raises(ConfigError, match="server.kind='vllm'"):
        typed("experiment=spec_decode", "server=endpoint", "server.base_url=http://h:1",
              "server.tokenizer=/t")


def test_bad_acceptance_settings_name_their_keys():
    with pytest.raises(ConfigError) as e:
        typed("experiment=spec_decode", "experiment.acceptance=trained", "experiment.spec_repeats=0")
    assert "experiment.acceptance='trained': expected 'synthetic'" in str(e.value)
    assert "experiment.spec_repeats=0: expected >= 1" in str(e.value)
    with pytest.raises(ConfigError, match=r"experiment.alphas=\[0.5, 1.5\]: each α must be in "
                                          r"\[0, 1\], not \[1.5\]"):
        typed("experiment=spec_decode", "experiment.alphas=[0.5,1.5]")
    with pytest.raises(ConfigError, match="experiment.extra sets the rejection sampling"):
        typed("experiment=spec_decode", "+experiment.extra.rejection_sample_method=standard")
    # more than one α is set inside the server's workers: a dev endpoint, loopback only
    with pytest.raises(ConfigError, match="experiment.acceptance=synthetic sets each α through "
                                          "/collective_rpc"):
        typed("experiment=spec_decode", "server.host=0.0.0.0")
    typed("experiment=spec_decode", "server.host=0.0.0.0", "experiment.alphas=[0.7]",
          "experiment.reset_prefix_cache=false")  # one α: no dev endpoint needed
