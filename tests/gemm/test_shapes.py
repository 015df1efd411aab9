from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest

from k25exp.gemm.shapes import (GemmShape, expert_m, expert_tokens, model_gemm_shapes,
                                routed_expert_dims)

# Kimi-K2 text backbone, from its config.json.
KIMI = SimpleNamespace(
    hidden_size=7168, num_hidden_layers=61, first_k_dense_replace=1, n_routed_experts=384,
    num_experts_per_tok=8, n_shared_experts=1, moe_intermediate_size=2048, intermediate_size=18432,
    num_attention_heads=64, q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128,
    qk_rope_head_dim=64, v_head_dim=128, vocab_size=163840,
)


def by_name(tp: int, **kw) -> dict[str, GemmShape]:
    shapes = model_gemm_shapes(KIMI, tp, **kw)
    assert len({s.name for s in shapes}) == len(shapes)
    return {s.name: s for s in shapes}


def test_kimi_tp1_shapes():
    s = by_name(1)
    dims = {name: (sh.n, sh.k) for name, sh in s.items()}
    assert dims == {
        "expert_gate_up": (4096, 7168),
        "expert_down": (7168, 2048),
        "router": (384, 7168),
        "shared_gate_up": (4096, 7168),
        "shared_down": (7168, 2048),
        "dense_gate_up": (36864, 7168),
        "dense_down": (7168, 18432),
        "fused_qkv_a_proj": (1536 + 512 + 64, 7168),
        "q_b_proj": (64 * 192, 1536),
        "kv_b_proj": (64 * 256, 512),
        "o_proj": (7168, 64 * 128),
        "lm_head": (163840, 7168),
    }
    assert "fused" in s["fused_qkv_a_proj"].note and s["fused_qkv_a_proj"].parallel == "replicated"


def test_kimi_layers_counts_and_parallel():
    s = by_name(1)
    assert (s["expert_gate_up"].layers, s["expert_gate_up"].count_per_layer) == (60, 8)
    assert (s["expert_down"].layers, s["expert_down"].count_per_layer) == (60, 8)
    assert (s["shared_down"].layers, s["shared_down"].count_per_layer) == (60, 1)
    assert s["dense_gate_up"].layers == s["dense_down"].layers == 1
    assert s["q_b_proj"].layers == s["o_proj"].layers == s["kv_b_proj"].layers == 61
    assert s["lm_head"].layers == 1
    parallel = {name: sh.parallel for name, sh in s.items()}
    assert parallel["expert_gate_up"] == parallel["q_b_proj"] == parallel["lm_head"] == "column"
    assert parallel["expert_down"] == parallel["o_proj"] == parallel["dense_down"] == "row"


def test_kimi_tp8_shapes():
    s = by_name(8)
    assert (s["expert_gate_up"].n, s["expert_gate_up"].k) == (512, 7168)
    assert (s["expert_down"].n, s["expert_down"].k) == (7168, 256)
    assert (s["shared_gate_up"].n, s["shared_down"].k) == (512, 256)
    assert (s["dense_gate_up"].n, s["dense_down"].k) == (4608, 2304)
    assert (s["fused_qkv_a_proj"].n, s["fused_qkv_a_proj"].k) == (2112, 7168)  # replicated
    assert (s["q_b_proj"].n, s["q_b_proj"].k) == (1536, 1536)
    assert (s["kv_b_proj"].n, s["kv_b_proj"].k) == (2048, 512)
    assert (s["o_proj"].n, s["o_proj"].k) == (7168, 1024)
    assert (s["lm_head"].n, s["lm_head"].k) == (20480, 7168)
    assert (s["router"].n, s["router"].k) == (384, 7168)


def test_without_lm_head():
    assert "lm_head" not in by_name(8, include_lm_head=False)


def test_non_divisible_tp_names_the_shape():
    with pytest.raises(ValueError, match=r"expert_gate_up.*moe_intermediate_size=2048.*tp=3"):
        model_gemm_shapes(KIMI, 3)
    odd_heads = SimpleNamespace(**{**vars(KIMI), "num_attention_heads": 6})
    with pytest.raises(ValueError, match=r"q_b_proj.*num_attention_heads=6"):
        model_gemm_shapes(odd_heads, 4)
    with pytest.raises(ValueError, match="tp"):
        model_gemm_shapes(KIMI, 0)


def test_gemm_shape_validates():
    s = GemmShape("x", 8, 8, "column")
    with pytest.raises(ValueError, match="parallel"):
        replace(s, parallel="diagonal")
    with pytest.raises(ValueError, match="positive"):
        replace(s, n=0)


def test_expert_tokens_and_m():
    assert expert_tokens(1, 8, 384) == pytest.approx(8 / 384)
    assert expert_m(1, 8, 384) == 1
    assert expert_m(0, 8, 384) == 1
    assert expert_m(48, 8, 384) == 1  # exactly 1.0
    assert expert_m(49, 8, 384) == 2
    assert expert_m(128, 8, 384) == 3  # 2.67 rounds up
    assert expert_m(4096, 8, 384) == 86
    with pytest.raises(ValueError):
        expert_tokens(1, 0, 384)


# --- a rank model (model.tp_rank_of): one TP rank's shapes, never sharded twice --------------
def kimi_rank(n) -> SimpleNamespace:
    """KIMI as a run's params rebuild it (report.measured.model_of): name and tp_rank_of as
    strings ("null" when unset), numbers cast."""
    return SimpleNamespace(**vars(KIMI), num_key_value_heads=64, name="kimi_k25_int4", tp_rank_of=n)


def test_a_tp8_rank_at_tp1_times_one_tp8_ranks_shapes():
    rank = {s.name: (s.n, s.k) for s in model_gemm_shapes(kimi_rank(8), 1)}
    # written out by hand: experts 2048/8 = 256, dense 18432/8 = 2304, 8 heads, vocab/8
    assert rank == {
        "expert_gate_up": (512, 7168), "expert_down": (7168, 256), "router": (384, 7168),
        "shared_gate_up": (512, 7168), "shared_down": (7168, 256),
        "dense_gate_up": (4608, 7168), "dense_down": (7168, 2304),
        "fused_qkv_a_proj": (2112, 7168), "q_b_proj": (1536, 1536), "kv_b_proj": (2048, 512),
        "o_proj": (7168, 1024), "lm_head": (20480, 7168)}
    assert rank == {name: (s.n, s.k) for name, s in by_name(8).items()}  # = the whole at TP 8
    assert {s.name: (s.n, s.k) for s in model_gemm_shapes(kimi_rank("8"), 1)} == rank
    assert {s.name: (s.n, s.k) for s in model_gemm_shapes(kimi_rank("null"), 1)} == \
        {name: (s.n, s.k) for name, s in by_name(1).items()}  # null: the whole model


def test_a_rank_is_never_sharded_again():
    with pytest.raises(ValueError, match=r"model.tp_rank_of=8 already gives one TP-8 rank's "
                                         r"shapes.*tp=8.*experiment.tp=1"):
        model_gemm_shapes(kimi_rank(8), 8)
    with pytest.raises(ValueError, match="tp=2"):
        routed_expert_dims(kimi_rank(8), 2)
    assert routed_expert_dims(kimi_rank(8), 1) == (384, 7168, 256)
    assert routed_expert_dims(KIMI, 8) == (384, 7168, 256)
    assert routed_expert_dims(KIMI, 1) == (384, 7168, 2048)
