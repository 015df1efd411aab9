"""The `quantization_config` of a generated config.json, from the model's `quant` group.

Kimi-K2.5's INT4 checkpoint is compressed-tensors `pack-quantized`: symmetric integer weights
in groups with bf16 scales, activations bf16 (W4A16), on the routed experts only. The ignore
list keeps lm_head, attention, the shared experts and the dense MLP in bf16; the router
(`mlp.gate`) is built without a quant config by vLLM, so it needs no entry. With this config
vLLM 0.26 picked CompressedTensorsWNA16MarlinMoEMethod (Marlin W4A16 MoE) on an H200 for one
TP-8 rank (../shared/gpu/README.md).
"""

from __future__ import annotations

from typing import Any, Optional

# Module names (vLLM's, as in DeepSeek-V3 / Kimi-K2 checkpoints) that stay unquantized.
IGNORE = ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*",
          "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"]
FORMATS = ("pack-quantized",)


def is_quantized(quant: Any) -> bool:
    """Whether `model.quant` names a quantization (method "none" or empty: bf16 weights)."""
    return quant is not None and getattr(quant, "method", "none") not in ("none", "")


def quantization_config(quant: Any) -> Optional[dict]:
    """config.json's quantization_config for `model.quant`, or None for bf16 weights.
    Raises ValueError naming the key for a scheme this generator does not write."""
    if not is_quantized(quant):
        return None
    if quant.method != "w4a16":
        raise ValueError(f"model.quant.method={quant.method!r}: the model folder generator writes "
                         "compressed-tensors W4A16 (w4a16) or bf16 (none) configs")
    if quant.format not in FORMATS:
        raise ValueError(f"model.quant.format={quant.format!r}: expected one of {list(FORMATS)}")
    if quant.bits not in (4, 8) or quant.group_size <= 0:
        raise ValueError(f"model.quant.bits={quant.bits}, group_size={quant.group_size}: "
                         "pack-quantized W4A16 needs bits 4 or 8 and a group size > 0")
    if not quant.symmetric:  # zero points: neither written nor counted by weight_bytes
        raise ValueError("model.quant.symmetric=false: the generator writes symmetric schemes "
                         "only (Kimi's INT4 checkpoints are symmetric)")
    weights = {"num_bits": quant.bits, "type": "int", "symmetric": True,
               "strategy": "group", "group_size": quant.group_size, "dynamic": False,
               "actorder": None, "block_structure": None, "observer": "minmax",
               "observer_kwargs": {}}
    return {"quant_method": "compressed-tensors", "format": quant.format,
            "quantization_status": "compressed", "kv_cache_scheme": None,
            "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": None,
                                          "output_activations": None, "weights": weights}},
            "ignore": list(IGNORE)}
