"""Bytes one tensor-parallel rank must read from memory in one decode step, by category.

A decode step at small batch is memory-bound: every weight it touches is read once, and the
KV cache once per sequence. Those bytes over the GPU's memory bandwidth are the step's floor
(k25exp.gemm.floor). The GEMM shapes come from ``shapes.model_gemm_shapes`` (one rank's
shards under TP ``tp``), so what is sharded and what is replicated is decided in one place.

Counted: weights, as the checkpoint stores them (``model.quant`` for the routed experts —
int4 packed plus one scale per group —, ``model.dtype`` for everything else), and the MLA
latent KV cache. Left out on purpose: activations (at the batches profiled, ≤ 32, a few %
of the weights: ~20 MB per token for a Kimi rank against 6–40 GB of weights), norms and
biases (~2 MB per step for Kimi), the embedding rows (one row per token).

Pure Python (no torch): the profile runner and the report use it on machines without a GPU.
"""

from __future__ import annotations

from typing import Any, Mapping

from k25exp.dtypes import dtype_bytes
from k25exp.gemm.shapes import model_gemm_shapes
from k25exp.model.quant_config import is_quantized

# Categories of what a step reads, in the order tables list them.
CATEGORIES = ("attention_proj", "dense_mlp", "router", "shared_expert", "routed_experts",
              "lm_head", "kv_cache")

# Which category each GEMM of shapes.model_gemm_shapes belongs to. A GEMM added there and
# not here is an error (step_bytes), never silently uncounted.
SHAPE_CATEGORY = {
    "fused_qkv_a_proj": "attention_proj", "q_b_proj": "attention_proj",
    "q_proj": "attention_proj", "kv_a_proj_with_mqa": "attention_proj",
    "kv_b_proj": "attention_proj",  # absorbed into per-head BMMs at decode: same weights
    "o_proj": "attention_proj",
    "dense_gate_up": "dense_mlp", "dense_down": "dense_mlp",
    "router": "router",
    "shared_gate_up": "shared_expert", "shared_down": "shared_expert",
    "expert_gate_up": "routed_experts", "expert_down": "routed_experts",
    "lm_head": "lm_head",
}


def active_experts(tokens: float, top_k: int, n_experts: int) -> float:
    """Expected number of distinct experts a layer runs for ``tokens`` tokens that each pick
    ``top_k`` of ``n_experts`` uniformly: E·(1 − (1 − k/E)^c). 1 token → k; many → E."""
    if tokens < 0 or not 1 <= top_k <= n_experts:
        raise ValueError(f"need tokens >= 0 and 1 <= top_k <= n_experts; got tokens={tokens}, "
                         f"top_k={top_k}, n_experts={n_experts}")
    return n_experts * (1.0 - (1.0 - top_k / n_experts) ** tokens)


def weight_bytes(n: int, k: int, quant: Any, dense_bytes: int) -> float:
    """Bytes of one ``[n x k]`` weight: ``dense_bytes`` per value, or, for a quantized
    layout (``quant.method`` w4a16 …), ``quant.bits`` per value plus one ``quant.scale_dtype``
    scale per ``quant.group_size`` values along k (compressed-tensors pack-quantized,
    symmetric: no zero points)."""
    if not is_quantized(quant):
        return float(n * k * dense_bytes)
    method = quant.method
    bits, group = int(quant.bits), int(quant.group_size)
    if bits <= 0 or group <= 0:
        raise ValueError(f"quant.method={method!r} needs bits > 0 and group_size > 0; got "
                         f"bits={bits}, group_size={group}")
    if k % group:
        raise ValueError(f"K={k} is not a multiple of quant.group_size={group}")
    return n * k * bits / 8 + n * (k // group) * dtype_bytes(quant.scale_dtype)


def step_bytes(model: Any, tp: int, batch: int, context_tokens: float,
               experts: float | None = None) -> dict[str, float]:
    """Bytes per category one rank of TP ``tp`` reads in one decode step of ``batch``
    sequences whose context is ``context_tokens`` tokens long.

    ``model`` has config.json's attribute names (ModelConfig, a DictConfig, a namespace);
    pass a config already reduced to one rank's shapes with ``tp=1``. Routed experts: the
    expected distinct experts ``batch`` tokens activate (uniform routing) per MoE layer,
    or ``experts`` per layer when given.
    KV cache: MLA keeps one latent of ``kv_lora_rank + qk_rope_head_dim`` values per token
    and layer, replicated on every TP rank (all heads share it), in ``model.dtype``.
    """
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    if context_tokens < 0:
        raise ValueError(f"context_tokens must be >= 0, got {context_tokens}")
    dense = int(model.dtype_bytes)
    quant = getattr(model, "quant", None)
    if experts is None:
        experts = active_experts(batch, model.num_experts_per_tok, model.n_routed_experts)
    out = dict.fromkeys(CATEGORIES, 0.0)
    for s in model_gemm_shapes(model, tp):
        cat = SHAPE_CATEGORY.get(s.name)
        if cat is None:
            raise ValueError(f"GEMM {s.name!r} has no byte category: add it to "
                             "k25exp.gemm.step_bytes.SHAPE_CATEGORY")
        if cat == "routed_experts":  # only they are quantized in W4A16 checkpoints
            out[cat] += weight_bytes(s.n, s.k, quant, dense) * experts * s.layers
        else:
            out[cat] += weight_bytes(s.n, s.k, None, dense) * s.layers
    latent = model.kv_lora_rank + model.qk_rope_head_dim
    out["kv_cache"] = float(batch * context_tokens * model.num_hidden_layers * latent * dense)
    return out


def total(by_category: Mapping[str, float]) -> float:
    return float(sum(by_category.values()))
