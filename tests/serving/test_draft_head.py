"""k25exp.serving.draft_head: the EAGLE-3 head built from the served checkpoint's config, its
weights, and speculative_config's draft_model=eagle3_head."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from k25exp.config.spec_methods import EAGLE3_HEAD
from k25exp.config.validate import to_typed
from k25exp.model.tp_rank import rank_model
from k25exp.serving import draft_head, tiny_model
from k25exp.serving.speculative import speculative_config
from tests.conftest import compose_cfg


def _model(*overrides: str):
    """The `model` group's config (tiny_kimi unless overridden)."""
    return OmegaConf.to_object(compose_cfg("model=tiny_kimi", *overrides).model)


def _target(folder: Path, model, weights: bool) -> Path:
    """A target folder: the config.json tiny_model generates, and a weights file or none."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(tiny_model.hf_config(model)))
    if weights:
        (folder / "model.safetensors").write_bytes(b"target weights")
    return folder


def test_the_head_is_sized_from_the_tiny_models_config():
    m = _model()  # tiny_kimi, the embedded default
    cfg = draft_head.head_config(tiny_model.hf_config(m))
    assert cfg["architectures"] == ["Eagle3DeepseekV2ForCausalLM"]
    assert cfg["model_type"] == "deepseek_v2"  # deepseek_v3 would be read as an MTP draft
    assert cfg["num_hidden_layers"] == 1
    for k in ("hidden_size", "intermediate_size", "num_attention_heads", "vocab_size",
              "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
        assert cfg[k] == getattr(m, k), k
    assert cfg["target_hidden_size"] == m.hidden_size and cfg["draft_vocab_size"] == m.vocab_size
    # 3 target layers: vLLM's default (2, 1, 0) would read layer 0 (the embedding, residual
    # None); 1, ceil(3 / 2), 3 instead
    n = m.num_hidden_layers
    assert n == 3 and cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]

    h, heads, inter = m.hidden_size, m.num_attention_heads, m.intermediate_size
    qk = m.qk_nope_head_dim + m.qk_rope_head_dim
    a = "midlayer.self_attn."
    assert draft_head.weight_shapes(cfg) == {
        "fc.weight": (h, 3 * h),  # three target layers' hidden states in
        "midlayer.input_layernorm.weight": (h,),
        "midlayer.hidden_norm.weight": (h,),
        a + "q_a_proj.weight": (m.q_lora_rank, 2 * h),  # [embedding ; hidden] in
        a + "q_a_layernorm.weight": (m.q_lora_rank,),
        a + "q_b_proj.weight": (heads * qk, m.q_lora_rank),
        a + "kv_a_proj_with_mqa.weight": (m.kv_lora_rank + m.qk_rope_head_dim, 2 * h),
        a + "kv_a_layernorm.weight": (m.kv_lora_rank,),
        a + "kv_b_proj.weight": (heads * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank),
        a + "o_proj.weight": (h, heads * m.v_head_dim),
        "midlayer.post_attention_layernorm.weight": (h,),
        "midlayer.mlp.gate_proj.weight": (inter, h),
        "midlayer.mlp.up_proj.weight": (inter, h),
        "midlayer.mlp.down_proj.weight": (h, inter),
        "norm.weight": (h,),
        "lm_head.weight": (m.vocab_size, h),
    }


def test_the_kimi_rank_gets_an_unquantized_head_with_vllms_default_layers():
    m = _model("model=kimi_k25_int4", "model.tp_rank_of=8")
    target = tiny_model.hf_config(rank_model(m))  # the config.json of the rank's folder
    cfg = draft_head.head_config(target)
    assert "quantization_config" in target and "quantization_config" not in cfg
    assert cfg["hidden_size"] == target["hidden_size"] and cfg["vocab_size"] == target["vocab_size"]
    n = target["num_hidden_layers"]
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, n // 2, n - 3]


def test_aux_layers_need_three_target_layers():
    assert draft_head.aux_layer_ids(4) == [1, 2, 4]  # vLLM's default (1, 2, 2) repeats one
    assert draft_head.aux_layer_ids(7) == [2, 3, 4]
    with pytest.raises(ValueError, match="num_hidden_layers=2"):
        draft_head.aux_layer_ids(2)


def test_a_target_with_weights_gets_seeded_weights_by_vllms_names(tmp_path):
    from safetensors import safe_open

    target = _target(tmp_path / "tiny", _model(), weights=True)
    head = draft_head.eagle3_head(target, tmp_path / "cache")
    cfg = json.loads((head / "config.json").read_text())
    with safe_open(str(head / draft_head.WEIGHTS), "pt") as f:
        got = {k: (tuple(f.get_slice(k).get_shape()), f.get_slice(k).get_dtype()) for k in f.keys()}
        norm = f.get_tensor("norm.weight")
        fc = f.get_tensor("fc.weight")
    assert got == {k: (s, "BF16") for k, s in draft_head.weight_shapes(cfg).items()}
    assert bool((norm == 1).all()) and 0.01 < float(fc.float().std()) < 0.03
    # same input, same folder (content-hashed name), not rewritten
    stamp = (head / draft_head.WEIGHTS).stat().st_mtime_ns
    assert draft_head.eagle3_head(target, tmp_path / "cache") == head
    assert (head / draft_head.WEIGHTS).stat().st_mtime_ns == stamp
    assert head.name.startswith("tiny-eagle3-")


def test_a_target_without_weights_gets_config_only(tmp_path):
    with_w = draft_head.eagle3_head(_target(tmp_path / "a" / "rank", _model(), True), tmp_path / "c")
    without = draft_head.eagle3_head(_target(tmp_path / "b" / "rank", _model(), False), tmp_path / "c")
    assert without != with_w  # weights or not is part of the name
    assert sorted(p.name for p in without.iterdir()) == ["config.json", draft_head.MANIFEST]
    same = [json.loads((h / "config.json").read_text()) for h in (without, with_w)]
    assert same[0] == same[1]
    assert "dummy" in json.loads((without / draft_head.MANIFEST).read_text())["weights"]


def test_spec_eagle3_builds_the_head_into_the_model_cache(tmp_path):
    exp = to_typed(compose_cfg("experiment=spec_decode", "spec=eagle3"), gpu_count=lambda: 0).experiment
    assert exp.method == "eagle3" and exp.draft_model == EAGLE3_HEAD and exp.acceptance == "synthetic"
    target = _target(tmp_path / "tiny", _model(), weights=False)
    spec = speculative_config(exp, target, tmp_path / "cache")
    assert spec["method"] == "eagle3" and spec["num_speculative_tokens"] == 3
    assert Path(spec["model"]) == draft_head.eagle3_head(target, tmp_path / "cache")
    assert Path(spec["model"]).parent == tmp_path / "cache"
    assert spec["rejection_sample_method"] == "synthetic"


@pytest.mark.vllm
def test_the_heads_rope_passes_vllm_026s_eagle3_layer_and_rotates_as_no_scaling(tmp_path):
    """vLLM 0.26's DeepseekV2Eagle3DecoderLayer takes any truthy config.rope_scaling as
    deepseek_yarn and reads its "factor"; transformers 5 fills rope_scaling with
    {rope_type: default, rope_theta} when the file has none, so a head written with
    rope_scaling null died at start on the H100 ("KeyError: 'factor'"). The head of a target
    without scaling now carries a YaRN of factor 1: read as that layer reads it, vLLM's own
    get_rope builds it, and its cos/sin table is plain RoPE's, computed here by hand."""
    import math

    import torch
    from transformers import AutoConfig
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.rotary_embedding import get_rope
    from vllm.model_executor.layers.rotary_embedding.common import yarn_get_mscale

    target = tiny_model.hf_config(rank_model(_model("model=kimi_k25_int4", "model.tp_rank_of=8")))
    assert target.get("rope_scaling") is None
    (tmp_path / "config.json").write_text(json.dumps(draft_head.head_config(target)))
    cfg = AutoConfig.from_pretrained(tmp_path)
    # deepseek_eagle3.py (0.26): rope_params = rope_scaling.copy(); rope_type = "deepseek_yarn"
    assert cfg.rope_scaling
    params = dict(cfg.rope_scaling, rope_type="deepseek_yarn")
    dim, positions = target["qk_rope_head_dim"], 512
    params["original_max_position_embeddings"] = positions  # a short table; factor 1 keeps it
    with set_current_vllm_config(VllmConfig()):  # vLLM's rotary layers are CustomOps
        rope = get_rope(dim, max_position=positions, is_neox_style=False,
                        rope_parameters=params, dtype=torch.float32)
    theta = target["rope_theta"]
    inv = [1.0 / theta ** (2 * i / dim) for i in range(dim // 2)]
    by_hand = torch.tensor([[math.cos(t * f) for f in inv] + [math.sin(t * f) for f in inv]
                            for t in range(positions)])
    torch.testing.assert_close(rope.cos_sin_cache.float(), by_hand, atol=1e-4, rtol=0)
    # DeepseekV2MLAAttention scales its softmax by yarn_get_mscale(factor, mscale_all_dim)²
    assert yarn_get_mscale(params["factor"], float(params["mscale_all_dim"])) == 1.0


def test_a_target_with_rope_scaling_keeps_its_own():
    target = tiny_model.hf_config(_model())
    scaled = {"type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096,
              "beta_fast": 1.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}
    assert draft_head.head_config({**target, "rope_scaling": scaled})["rope_scaling"] == scaled
