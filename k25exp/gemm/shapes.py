"""The GEMMs of a DeepseekV3-style model as vLLM shards them under tensor parallelism.

Every shape is a weight ``W`` of ``[n x k]`` (out_features x in_features, as ``nn.Linear``
stores it); the GEMM is ``y = x @ W.T`` with ``x`` of ``[M x k]``. The unsharded (tp=1)
shapes are simply ``model_gemm_shapes(model, 1)``.

A rank model (``model.tp_rank_of=N``, k25exp.model.tp_rank) is already one TP-N rank's
shard: its shapes are ``model_gemm_shapes(model, 1)``, the same (n, k) as the whole model's at
tp=N, labelled ``.tp1`` because that is how the rank is served. Sharding it again (tp > 1) is
refused, so neither the gemm runner nor the report (which rebuilds the model from a run's
``model.*`` params, tp_rank_of included, and takes tp from its ``experiment.tp``) can divide a
rank by hardware.tp a second time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from k25exp.model.tp_rank import rank_model, rank_of

PARALLEL_KINDS = ("column", "row", "replicated")


@dataclass(frozen=True)
class GemmShape:
    name: str
    n: int  # out_features of this rank's shard
    k: int  # in_features of this rank's shard
    parallel: str  # "column" | "row" | "replicated"
    count_per_layer: int = 1  # how many times one layer runs this GEMM for one token
    layers: int = 1  # how many layers contain this GEMM
    note: str = ""

    def __post_init__(self) -> None:
        if self.parallel not in PARALLEL_KINDS:
            raise ValueError(f"{self.name}: parallel must be one of {PARALLEL_KINDS}, got {self.parallel!r}")
        if self.n <= 0 or self.k <= 0:
            raise ValueError(f"{self.name}: n and k must be positive, got n={self.n} k={self.k}")


def _shard(name: str, what: str, size: int, tp: int) -> int:
    """``size / tp``, refusing to round: vLLM refuses such a shard too."""
    if size % tp:
        raise ValueError(f"GEMM {name!r}: {what}={size} is not divisible by tp={tp}")
    return size // tp


def model_gemm_shapes(model: Any, tp: int, include_lm_head: bool = True) -> list[GemmShape]:
    """Per-rank GEMM shapes of a DeepseekV3ForCausalLM (Kimi-K2) served by vLLM at TP ``tp``.

    ``model`` is anything with the config.json attribute names (a dataclass, a namespace,
    a DictConfig). Raises ValueError naming the GEMM when a sharded dim is not divisible, and
    for a rank model (tp_rank_of set) at tp > 1.
    """
    if tp < 1:
        raise ValueError(f"tp must be >= 1, got {tp}")
    m = _served(model, tp)
    hidden = m.hidden_size
    moe_layers = m.num_hidden_layers - m.first_k_dense_replace
    dense_layers = m.first_k_dense_replace
    all_layers = m.num_hidden_layers
    qk_head = m.qk_nope_head_dim + m.qk_rope_head_dim
    shapes: list[GemmShape] = []

    if moe_layers > 0:
        # vLLM's FusedMoE keeps every expert on every rank and shards the intermediate dim
        # (w13 is [E, 2*I/tp, H], w2 is [E, H, I/tp]); the all-reduce after w2 sums the ranks.
        inter = _shard("expert_gate_up", "moe_intermediate_size", m.moe_intermediate_size, tp)
        top_k = m.num_experts_per_tok
        routed = (
            f"routed expert; count_per_layer = top_k ({top_k}) expert GEMMs per token: at batch B a "
            f"layer runs min({m.n_routed_experts}, B*{top_k}) experts with about "
            f"B*{top_k}/{m.n_routed_experts} rows each (see expert_tokens); W4A16 in INT4 checkpoints"
        )
        shapes += [
            GemmShape("expert_gate_up", 2 * inter, hidden, "column", top_k, moe_layers, routed),
            GemmShape("expert_down", hidden, inter, "row", top_k, moe_layers, routed),
            # The router is a ReplicatedLinear that stays unquantized; tiny but in every MoE layer.
            GemmShape("router", m.n_routed_experts, hidden, "replicated", 1, moe_layers,
                      "MoE gate (router logits), replicated, not quantized"),
        ]
        if m.n_shared_experts:
            # vLLM builds the shared experts as one MLP of n_shared * moe_intermediate_size.
            shared = _shard("shared_gate_up", "n_shared_experts*moe_intermediate_size",
                            m.n_shared_experts * m.moe_intermediate_size, tp)
            note = f"{m.n_shared_experts} shared expert(s) fused into one MLP; bf16 in Kimi INT4 checkpoints"
            shapes += [
                GemmShape("shared_gate_up", 2 * shared, hidden, "column", 1, moe_layers, note),
                GemmShape("shared_down", hidden, shared, "row", 1, moe_layers, note),
            ]

    if dense_layers > 0:
        inter = _shard("dense_gate_up", "intermediate_size", m.intermediate_size, tp)
        note = f"dense MLP of the first {dense_layers} layer(s)"
        shapes += [
            GemmShape("dense_gate_up", 2 * inter, hidden, "column", 1, dense_layers, note),
            GemmShape("dense_down", hidden, inter, "row", 1, dense_layers, note),
        ]

    # MLA shards whole heads, so the head count (not the product) must divide.
    q_name = "q_b_proj" if m.q_lora_rank else "q_proj"
    heads = _shard(q_name, "num_attention_heads", m.num_attention_heads, tp)
    # With a q LoRA, vLLM fuses q_a_proj and kv_a_proj_with_mqa into one replicated GEMM.
    if m.q_lora_rank:
        shapes += [
            GemmShape("fused_qkv_a_proj", m.q_lora_rank + m.kv_lora_rank + m.qk_rope_head_dim, hidden,
                      "replicated", 1, all_layers,
                      "q_a_proj [q_lora_rank] + kv_a_proj_with_mqa [kv_lora_rank + qk_rope_head_dim] "
                      "fused as vLLM's fused_qkv_a_proj; replicated on every rank"),
            GemmShape("q_b_proj", heads * qk_head, m.q_lora_rank, "column", 1, all_layers),
        ]
    else:  # DeepSeek-V2-Lite style: a plain q_proj, and kv_a on its own
        shapes += [
            GemmShape("q_proj", heads * qk_head, hidden, "column", 1, all_layers),
            GemmShape("kv_a_proj_with_mqa", m.kv_lora_rank + m.qk_rope_head_dim, hidden,
                      "replicated", 1, all_layers),
        ]
    shapes += [
        GemmShape("kv_b_proj", heads * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank, "column",
                  1, all_layers,
                  "runs as this GEMM in prefill; vLLM's MLA decode absorbs it into per-head BMMs"),
        GemmShape("o_proj", hidden, heads * m.v_head_dim, "row", 1, all_layers),
    ]

    if include_lm_head:
        vocab = _shard("lm_head", "vocab_size", m.vocab_size, tp)
        shapes.append(GemmShape("lm_head", vocab, hidden, "column", 1, 1, "vocab-parallel lm_head"))
    return shapes


def _served(model: Any, tp: int) -> Any:
    """The model one device runs before sharding by ``tp``: the rank of a rank model."""
    n = rank_of(model)
    if n is not None and tp != 1:
        raise ValueError(f"model.tp_rank_of={n} already gives one TP-{n} rank's shapes, which "
                         f"vLLM serves at TP 1; sharding it again by tp={tp} would divide it twice "
                         "(set experiment.tp=1, e.g. hardware=h200_x1)")
    return rank_model(model)


def routed_expert_dims(model: Any, tp: int) -> tuple[int, int, int]:
    """(experts, hidden, intermediate) of one MoE layer's routed experts on one rank at TP
    ``tp`` (FusedMoE: w13 [E, 2I, H], w2 [E, H, I]); a rank model's own at tp=1."""
    m = _served(model, tp)
    inter = _shard("expert_gate_up", "moe_intermediate_size", m.moe_intermediate_size, tp)
    return m.n_routed_experts, m.hidden_size, inter


def expert_tokens(batch: int, top_k: int, n_experts: int) -> float:
    """Average rows one routed expert sees in a step of ``batch`` tokens (uniform routing)."""
    if batch < 0 or top_k < 1 or n_experts < 1:
        raise ValueError(f"need batch >= 0, top_k >= 1, n_experts >= 1; got {batch}, {top_k}, {n_experts}")
    return batch * top_k / n_experts


def expert_m(batch: int, top_k: int, n_experts: int) -> int:
    """The GEMM M to benchmark for an expert: ``max(1, ceil(expert_tokens))``."""
    return max(1, math.ceil(expert_tokens(batch, top_k, n_experts)))
