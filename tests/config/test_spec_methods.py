"""k25exp.config.spec_methods: a speculative method vLLM refuses here stops at config time,
before any server starts, naming the key, vLLM's own message and what runs instead."""

from __future__ import annotations

import importlib.util

import pytest

from k25exp.config.validate import ConfigError, to_typed
from tests.conftest import compose_cfg


def typed(*overrides: str, gpus: int = 0):
    return to_typed(compose_cfg("experiment=spec_decode", *overrides), gpu_count=lambda: gpus)


def test_ngram_gpu_on_the_cpu_build_is_refused_with_vllms_message():
    with pytest.raises(ConfigError) as e:
        typed("spec=ngram_gpu")  # hardware=cpu_local, the embedded default
    (line,) = [p for p in str(e.value).splitlines() if "experiment.method=ngram_gpu" in p]
    # what vLLM's CPU build says as its workers start, verbatim
    assert ('"RuntimeError: pin_memory=True requires a CUDA or other accelerator backend; no '
            'pinned memory allocator is available on this system."') in line
    assert "hardware.device=cpu" in line and "Instead: experiment.method=ngram" in line


def test_ngram_gpu_passes_on_a_gpu_box():
    exp = typed("spec=ngram_gpu", "hardware=h200_x1", "hardware.device_name=", gpus=1).experiment
    assert exp.method == "ngram_gpu"


def test_mtp_is_refused_for_a_target_without_mtp_layers():
    with pytest.raises(ConfigError) as e:
        typed("experiment.method=mtp")
    msg = str(e.value)
    assert "experiment.method=mtp: the target (model=tiny_kimi (generated)) has no MTP layers" in msg
    assert '"ZeroDivisionError: integer modulo by zero"' in msg and "spec=eagle3" in msg


@pytest.mark.skipif(importlib.util.find_spec("arctic_inference") is not None,
                    reason="arctic-inference is installed here: suffix is served")
def test_suffix_without_arctic_inference_is_refused():
    with pytest.raises(ConfigError) as e:
        typed("experiment.method=suffix")
    assert ("experiment.method=suffix: the server's Python has no arctic_inference package. vLLM "
            'says "ImportError: Arctic Inference is required for suffix decoding.') in str(e.value)


def test_the_eagle3_head_sentinel_and_its_method_go_together():
    exp = typed("spec=eagle3").experiment  # no "no such folder" for the sentinel
    assert (exp.method, exp.draft_model) == ("eagle3", "eagle3_head")
    with pytest.raises(ConfigError, match="experiment.draft_model=eagle3_head builds an EAGLE-3 "
                                          "head: expected experiment.method=eagle3, not 'ngram'"):
        typed("experiment.draft_model=eagle3_head")
    with pytest.raises(ConfigError, match="experiment.draft_model=self: method=eagle3 needs a head"):
        typed("experiment.method=eagle3")
    # a folder that is not there is still one
    with pytest.raises(ConfigError, match="experiment.draft_model=/nope: no such folder"):
        typed("spec=eagle3", "experiment.draft_model=/nope")
