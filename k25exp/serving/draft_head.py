"""An EAGLE-3 draft head for the served checkpoint, built from its config.json: the drafter
vLLM serves for a DeepseekV3 (Kimi-shaped) target without a trained head.

    head = eagle3_head(target_folder, cache_dir)   # speculative_config(): draft_model=eagle3_head

The head is vLLM's EAGLE-3 model for DeepseekV2/V3 targets (`Eagle3DeepseekV2ForCausalLM`,
deepseek_eagle3.py, registered in 0.26 and 0.32 alike): one decoder layer with the target's
MLA attention and a dense MLP, whose attention reads [embedding ; hidden] (2 × hidden_size),
fed by `fc`, which projects the target's hidden states at three layers (3 × hidden_size) to
one. Sized from the target: hidden_size, vocab_size, attention heads, the MLA ranks and head
dims (which vLLM's MLA backends need as they are: 512 + 64 = 576 on the CPU, Kimi's 128 / 64 /
128 on CUDA), intermediate_size (the target's dense MLP), rms_norm_eps, rope. draft_vocab_size
= vocab_size, so vLLM needs no draft-to-target token map (d2t).

Why not the Llama-layer head published Kimi-K2 heads use (`LlamaForCausalLMEagle3`): its plain
attention beside the target's MLA needs a KV block size both backends take, and the CPU build
has none; it refuses at worker start with "ValueError: No common block size for 16 (CPU_MLA:
[16]; CPU_ATTN: [MultipleOf(32)])". An MLA head keeps one backend on either build.
model_type is deepseek_v2, not deepseek_v3: vLLM reads any deepseek_v3 config given as a draft
as an MTP head (SpeculativeConfig.hf_config_override), as the self-draft's docstring says.

The target layers fed to `fc` are written in the head (eagle_config.eagle_aux_hidden_state_
layer_ids): vLLM's default (2, n // 2, n − 3) where those are three distinct layers in 1 … n,
else 1, ⌈n / 2⌉, n. Id i is the hidden state entering target layer i (n: after the last layer).
vLLM's default is not taken blindly because on the 3-layer tiny model it is (2, 1, 0), and id
0 is the embedding, which DeepseekV2Model.forward reads as `hidden_states + residual` while
residual is still None.

Weights: a target folder with weights (the CPU tiny model's model.safetensors) gets seeded
random weights for the head, under the checkpoint names vLLM's loader maps (`midlayer.*`,
`fc`, `norm`, `lm_head`; no `embed_tokens`: vLLM shares the target's, as with trained heads).
A target without weights (the Kimi rank, served with --load-format dummy) gets config.json
only: vLLM loads the draft with the target's load config (0.26: SpeculativeConfig.
draft_load_config, None unless set, falls back to the target's in get_model; 0.32:
get_draft_load_config returns the target's unless it is ipc_cache), so the dummy loader
initialises the head too, and, finding no lm_head or embed_tokens in a checkpoint, vLLM shares
the target's. Either way the head proposes what random weights propose: acceptance must come
from experiment.acceptance=synthetic, never from these weights.

The folder is `<cache>/<target folder>-eagle3-<hash of the head's config, seed, weights or
not>`, written to a temporary sibling and renamed into place (as tiny_model does).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from k25exp.serving.staged import staged_folder

# Bump when the generated files change for the same inputs (invalidates every cache entry).
GENERATOR_VERSION = 2  # 2: an unscaled YaRN rope where the target has none (unscaled_yarn)
ARCHITECTURE = "Eagle3DeepseekV2ForCausalLM"  # vLLM: deepseek_eagle3.py
# the target's MLA attention, copied as it is (vLLM's MLA backends need its dims)
MLA_KEYS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
MANIFEST = "k25exp_draft_head.json"
WEIGHTS = "model.safetensors"
INIT_STD = 0.02
NUM_AUX = 3  # target layers EAGLE-3 reads (low, middle, high)


def aux_layer_ids(num_layers: int) -> list[int]:
    """The target layers whose hidden states feed the head (module docstring)."""
    if num_layers < NUM_AUX:
        raise ValueError(f"an EAGLE-3 head reads {NUM_AUX} target layers; the target has "
                         f"num_hidden_layers={num_layers}")
    vllm_default = sorted({2, num_layers // 2, num_layers - 3})
    if len(vllm_default) == NUM_AUX and vllm_default[0] >= 1:
        return vllm_default
    return sorted({1, (num_layers + 1) // 2, num_layers})


def unscaled_yarn(max_position: int) -> dict[str, Any]:
    """A YaRN rope of factor 1, which rotates as no scaling does (equal interpolated and
    extrapolated frequencies, mscale 1), for a target without rope scaling. Why not null:
    vLLM 0.26's DeepseekV2Eagle3DecoderLayer reads any truthy config.rope_scaling as
    deepseek_yarn and takes its "factor", and transformers 5 fills rope_scaling with the
    standardised {rope_type: default, rope_theta} when the file has none: the head failed at
    start on the H100 with "KeyError: 'factor'" (vLLM 0.32 no longer reads rope_scaling there)."""
    return {"type": "yarn", "factor": 1.0, "original_max_position_embeddings": max_position,
            "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}


def head_config(target: dict[str, Any]) -> dict[str, Any]:
    """config.json of the head for a target config.json (a DeepseekV3ForCausalLM's)."""
    return {
        "architectures": [ARCHITECTURE],
        "model_type": "deepseek_v2",  # not deepseek_v3: that one vLLM reads as an MTP draft
        "hidden_size": target["hidden_size"],
        "target_hidden_size": target["hidden_size"],
        "intermediate_size": target["intermediate_size"],
        "num_hidden_layers": 1,
        "num_attention_heads": target["num_attention_heads"],
        "num_key_value_heads": target.get("num_key_value_heads") or target["num_attention_heads"],
        **{k: target.get(k) for k in MLA_KEYS},
        "hidden_act": target.get("hidden_act", "silu"),
        "max_position_embeddings": target["max_position_embeddings"],
        "rms_norm_eps": target.get("rms_norm_eps", 1e-6),
        "rope_theta": target.get("rope_theta", 10000.0),
        "rope_scaling": (target.get("rope_scaling")
                         or unscaled_yarn(target["max_position_embeddings"])),
        "attention_bias": False,
        "tie_word_embeddings": False,
        "vocab_size": target["vocab_size"],
        "draft_vocab_size": target["vocab_size"],
        "eagle_config": {"use_aux_hidden_state": True,
                         "eagle_aux_hidden_state_layer_ids": aux_layer_ids(target["num_hidden_layers"])},
        "bos_token_id": target.get("bos_token_id"),
        "eos_token_id": target.get("eos_token_id"),
        "pad_token_id": target.get("pad_token_id"),
        "torch_dtype": target.get("torch_dtype", "bfloat16"),
    }


def weight_shapes(cfg: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every tensor of the head, by the checkpoint names vLLM's Eagle3DeepseekV2ForCausalLM
    loads (`midlayer.` → model.layers.0.; q_a / kv_a and gate / up fused by its mapper)."""
    h, inter, heads = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_attention_heads"]
    nope, rope, v = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    kv_rank, q_rank = cfg["kv_lora_rank"], cfg["q_lora_rank"]
    aux = len(cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"])
    a = "midlayer.self_attn."
    s: dict[str, tuple[int, ...]] = {
        "fc.weight": (h, aux * cfg["target_hidden_size"]),
        "midlayer.input_layernorm.weight": (h,),
        "midlayer.hidden_norm.weight": (h,),
    }
    if q_rank:  # the attention reads [embedding ; hidden]: 2 × hidden_size in
        s[a + "q_a_proj.weight"] = (q_rank, 2 * h)
        s[a + "q_a_layernorm.weight"] = (q_rank,)
        s[a + "q_b_proj.weight"] = (heads * (nope + rope), q_rank)
    else:
        s[a + "q_proj.weight"] = (heads * (nope + rope), 2 * h)
    s[a + "kv_a_proj_with_mqa.weight"] = (kv_rank + rope, 2 * h)
    s[a + "kv_a_layernorm.weight"] = (kv_rank,)
    s[a + "kv_b_proj.weight"] = (heads * (nope + v), kv_rank)
    s[a + "o_proj.weight"] = (h, heads * v)
    s["midlayer.post_attention_layernorm.weight"] = (h,)
    s["midlayer.mlp.gate_proj.weight"] = (inter, h)
    s["midlayer.mlp.up_proj.weight"] = (inter, h)
    s["midlayer.mlp.down_proj.weight"] = (h, inter)
    s["norm.weight"] = (h,)
    s["lm_head.weight"] = (cfg["draft_vocab_size"], h)
    return s


def make_weights(cfg: dict[str, Any], seed: int) -> dict:
    import torch

    dtype = getattr(torch, cfg["torch_dtype"])
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in weight_shapes(cfg).items():
        if name.endswith("norm.weight"):
            out[name] = torch.ones(shape, dtype=dtype)
        else:
            out[name] = (torch.randn(shape, generator=g) * INIT_STD).to(dtype)
    return out


def has_weights(target: Path) -> bool:
    """Whether the target folder holds weights (else it is served with dummy weights)."""
    return any(Path(target).glob("*.safetensors")) or any(Path(target).glob("*.bin"))


def head_hash(cfg: dict[str, Any], seed: int, weights: bool) -> str:
    key = {"config": cfg, "seed": seed, "weights": weights, "generator": GENERATOR_VERSION}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]


def eagle3_head(target: Path, cache_dir: Path, seed: int = 0) -> Path:
    """The cached EAGLE-3 head folder for the checkpoint `target`, generated if missing."""
    target = Path(target).resolve()
    cfg = head_config(json.loads((target / "config.json").read_text()))
    weights = has_weights(target)
    folder = Path(cache_dir) / f"{target.name}-eagle3-{head_hash(cfg, seed, weights)}"
    if (folder / MANIFEST).is_file():
        return folder
    try:
        _generate(cfg, seed, weights, folder)
    except OSError:
        if (folder / MANIFEST).is_file():  # another process renamed its copy into place first
            return folder
        raise
    return folder


def _generate(cfg: dict[str, Any], seed: int, weights: bool, out: Path) -> None:
    with staged_folder(out) as tmp:
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        if weights:
            from safetensors.torch import save_file

            save_file(make_weights(cfg, seed), str(tmp / WEIGHTS), metadata={"format": "pt"})
        (tmp / MANIFEST).write_text(json.dumps(
            {"architecture": ARCHITECTURE, "seed": seed, "hash": head_hash(cfg, seed, weights),
             "generator": GENERATOR_VERSION,
             "weights": WEIGHTS if weights else "none: vLLM's dummy loader initialises the head "
             "(the draft is loaded with the target's --load-format dummy)",
             "acceptance": "random weights: take it from experiment.acceptance=synthetic"},
            indent=2) + "\n")
