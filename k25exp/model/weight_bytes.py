"""How many bytes of weights vLLM holds for a model config, part by part.

For a rank model (`model.tp_rank_of=N`) it is one device's share (k25exp.model.tp_rank).
Every part is bf16 (`model.dtype`) except the routed experts of a quantized checkpoint
(compressed-tensors pack-quantized: `quant.bits` per weight packed into int32, plus one
`quant.scale_dtype` scale per `quant.group_size` weights; symmetric, so no zero points) and the
router's correction bias (fp32, as in Kimi-K2's checkpoint and vLLM's DeepseekV2MoE).

    embedding       vocab_padded × hidden (vLLM's VocabParallelEmbedding pads the vocabulary
                    to a multiple of 64 before splitting it; Kimi's 163,840 and its /8 need none)
    lm_head         vocab_padded × hidden
    attention       per layer (MLA): q_a_proj q_lora × h, q_b_proj heads·(nope+rope) × q_lora,
                    kv_a_proj_with_mqa (kv_lora+rope) × h, kv_b_proj heads·(nope+v) × kv_lora,
                    o_proj h × heads·v, q_a_layernorm q_lora, kv_a_layernorm kv_lora
    norms           input and post-attention layernorms (2·h per layer) + the final norm (h)
    dense_mlp       gate, up, down: 3 × intermediate × h per dense layer
    router          n_experts × h (bf16) + n_experts (fp32 e_score_correction_bias) per MoE layer
    shared_experts  3 × n_shared·moe_intermediate × h per MoE layer (bf16 in Kimi INT4)
    routed_experts  n_experts × 3 × moe_intermediate × h per MoE layer
    mla_decode_copies  not in the checkpoint: after loading, vLLM's MLA attention keeps bf16
                    copies of kv_b_proj split as W_UK_T and W_UV for the absorbed decode BMMs
                    (MLAAttention.process_weights_after_loading, vLLM 0.26 and 0.32: "the extra
                    memory overhead of this is fairly low"): kv_b_proj's size again per layer.

`served` = every part (what vLLM's "Model loading took X GiB" counts, measured around loading
and process_weights_after_loading); `checkpoint` = served without the MLA copies (the tensors a
checkpoint holds). For one TP-8 rank of Kimi-K2.5 INT4: checkpoint 76,182,593,536 B = 70.95 GiB,
served 76,310,519,808 B = 71.07 GiB, which is what vLLM 0.26 logged on an H200 (71.07 GiB).
The issue's "about 75–80 GB" is the same figure in decimal GB (76.2–76.3 GB). Not counted
(transient or tiny): Marlin's repacking buffers and workspace, compressed-tensors'
weight_shape tensors (2 int64 per module), the act-order g_idx tensors vLLM allocates and
empties after loading when actorder is null.
"""

from __future__ import annotations

from typing import Any

from k25exp.dtypes import dtype_bytes
from k25exp.model.quant_config import is_quantized
from k25exp.model.tp_rank import rank_model

VOCAB_PADDING = 64  # vLLM's DEFAULT_VOCAB_PADDING_SIZE
PACK_BITS = 32  # pack-quantized packs low-bit weights into int32
CHECKPOINT_PARTS = ("embedding", "lm_head", "attention", "norms", "dense_mlp", "router",
                    "shared_experts", "routed_experts")


def quantized(model: Any) -> bool:
    return is_quantized(model.quant)


def _padded_vocab(v: int) -> int:
    return -(-v // VOCAB_PADDING) * VOCAB_PADDING


def expert_bytes(n_weights: int, model: Any) -> int:
    """Bytes of `n_weights` routed-expert weights as stored: packed low-bit + group scales when
    quantized, else model.dtype."""
    if not quantized(model):
        return n_weights * dtype_bytes(model.dtype)
    q = model.quant
    if (n_weights * q.bits) % PACK_BITS or n_weights % q.group_size:
        raise ValueError(f"{n_weights} expert weights do not pack into int32 at {q.bits} bits or "
                         f"split into groups of model.quant.group_size={q.group_size}")
    return n_weights * q.bits // 8 + n_weights // q.group_size * dtype_bytes(q.scale_dtype)


def estimate(model: Any) -> dict[str, int]:
    """Bytes per part (see the module doc), plus `checkpoint` and `served` totals, for the
    model as one device serves it (`rank_model(model)`)."""
    m = rank_model(model)
    b = dtype_bytes(m.dtype)
    h, heads = m.hidden_size, m.num_attention_heads
    layers, dense = m.num_hidden_layers, m.first_k_dense_replace
    moe = layers - dense
    vocab = _padded_vocab(m.vocab_size)
    kv_b = heads * (m.qk_nope_head_dim + m.v_head_dim) * m.kv_lora_rank
    if m.q_lora_rank:
        q = m.q_lora_rank * h + heads * (m.qk_nope_head_dim + m.qk_rope_head_dim) * m.q_lora_rank \
            + m.q_lora_rank
    else:
        q = heads * (m.qk_nope_head_dim + m.qk_rope_head_dim) * h
    attn = q + (m.kv_lora_rank + m.qk_rope_head_dim) * h + m.kv_lora_rank + kv_b \
        + h * heads * m.v_head_dim
    parts = {
        "embedding": vocab * h * b,
        "lm_head": vocab * h * b,
        "attention": layers * attn * b,
        "norms": (2 * layers + 1) * h * b,
        "dense_mlp": dense * 3 * m.intermediate_size * h * b,
        "router": moe * (m.n_routed_experts * h * b + m.n_routed_experts * 4),
        "shared_experts": moe * 3 * m.n_shared_experts * m.moe_intermediate_size * h * b,
        "routed_experts": moe * m.n_routed_experts
        * expert_bytes(3 * m.moe_intermediate_size * h, m),
        "mla_decode_copies": layers * kv_b * b,
    }
    parts["checkpoint"] = sum(parts[k] for k in CHECKPOINT_PARTS)
    parts["served"] = parts["checkpoint"] + parts["mla_decode_copies"]
    return parts


def describe(parts: dict[str, int]) -> str:
    """One line: the totals in GiB and GB, then the parts, largest first."""
    gib = 2 ** 30
    rest = sorted(((k, v) for k, v in parts.items() if k not in ("checkpoint", "served")),
                  key=lambda kv: -kv[1])
    return (f"weights {parts['served'] / gib:.2f} GiB ({parts['served'] / 1e9:.2f} GB) as vLLM "
            f"holds them, {parts['checkpoint'] / gib:.2f} GiB as a checkpoint stores them: "
            + ", ".join(f"{k} {v / gib:.3f} GiB" for k, v in rest))
