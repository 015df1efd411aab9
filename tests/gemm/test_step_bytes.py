"""The bytes a decode step reads and its floor, against counts made by hand here.

Issue 27 (item 7) quotes, for one TP-8 rank of Kimi-K2.5 INT4 at batch 1: about 6.0 GB per
step (attention projections 3.2 GB, 8 active experts x 60 layers 1.5 GB with scales, shared
experts 0.66 GB, router 0.33 GB, lm_head 0.29 GB, dense layer 0.1 GB), a floor of ~1.26 ms at
4.8 TB/s against the 7.06 ms measured. The count below, layer by layer from
conf/model/kimi_k25_int4.yaml, agrees with every one of those figures.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from k25exp.gemm.floor import TRACE_CATEGORIES, decode_floor, floor_metrics
from k25exp.gemm.step_bytes import CATEGORIES, active_experts, step_bytes, weight_bytes

ROOT = Path(__file__).resolve().parents[2]


def kimi(**changes) -> SimpleNamespace:
    """conf/model/kimi_k25_int4.yaml as the runner sees it (its dtype_bytes interpolation
    resolves to 2 for bfloat16)."""
    raw = yaml.safe_load((ROOT / "conf/model/kimi_k25_int4.yaml").read_text())
    raw.pop("defaults")
    raw["dtype_bytes"] = 2
    raw["quant"] = SimpleNamespace(**raw["quant"])
    raw.update(changes)
    return SimpleNamespace(**raw)


# --- one TP-8 rank of Kimi-K2.5 INT4, batch 1, counted by hand ------------------------------
# Shapes from the YAML: hidden 7168, 61 layers (layer 0 dense, 60 MoE), 64 heads -> 8 per rank,
# q_lora 1536, kv_lora 512, rope 64, qk_nope 128, v 128, experts 384 (top 8) of intermediate
# 2048 -> 256 per rank, 1 shared expert (2048 -> 256), dense intermediate 18432 -> 2304,
# vocab 163840 -> 20480. bf16 = 2 bytes.
ATTN_PER_LAYER = 2 * ((1536 + 512 + 64) * 7168   # fused q_a + kv_a (replicated, whole)
                      + 8 * (128 + 64) * 1536    # q_b_proj: 8 heads x 192
                      + 8 * (128 + 128) * 512    # kv_b_proj: 8 heads x (nope + v)
                      + 7168 * 8 * 128)          # o_proj
assert ATTN_PER_LAYER == 51_773_440
ATTN = 61 * ATTN_PER_LAYER                        # 3,158,179,840 B ~ 3.2 GB
DENSE = 2 * (2 * 2304 * 7168 + 7168 * 2304)       # layer 0's MLP: 99,090,432 B ~ 0.1 GB
ROUTER = 60 * 2 * 384 * 7168                      # replicated gate: 330,301,440 B ~ 0.33 GB
SHARED = 60 * 2 * (2 * 256 * 7168 + 7168 * 256)   # 660,602,880 B ~ 0.66 GB
# one expert's rank slice, int4: half a byte per value, plus a bf16 scale per 32 values along k
EXPERT = ((2 * 256 * 7168 + 7168 * 256) // 2
          + 2 * (2 * 256 * 7168 // 32 + 7168 * 256 // 32))
assert EXPERT == 2_752_512 + 344_064 == 3_096_576  # = 5,505,024 values x 4.5 bits
ROUTED = 8 * 60 * EXPERT                          # 1,486,356,480 B ~ 1.5 GB
LM_HEAD = 2 * 20480 * 7168                        # 293,601,280 B ~ 0.29 GB
KV_PER_TOKEN = 61 * (512 + 64) * 2                # MLA latent, every layer, whole on each rank
WEIGHTS = ATTN + DENSE + ROUTER + SHARED + ROUTED + LM_HEAD
assert WEIGHTS == 6_028_132_352


def test_kimi_tp8_rank_at_batch_1_matches_the_hand_count():
    got = step_bytes(kimi(), tp=8, batch=1, context_tokens=48)
    # (float: E(1 - (1 - k/E)^1) is k to 1e-15)
    assert got == pytest.approx({"attention_proj": ATTN, "dense_mlp": DENSE, "router": ROUTER,
                                 "shared_expert": SHARED, "routed_experts": ROUTED,
                                 "lm_head": LM_HEAD, "kv_cache": 48 * KV_PER_TOKEN}, rel=1e-12)
    # the issue's figures, to the digits it gives
    gb = {k: v / 1e9 for k, v in got.items()}
    assert (round(gb["attention_proj"], 1), round(gb["routed_experts"], 1), round(gb["shared_expert"], 2),
            round(gb["router"], 2), round(gb["lm_head"], 2), round(gb["dense_mlp"], 1)) == \
        (3.2, 1.5, 0.66, 0.33, 0.29, 0.1)
    assert round(sum(gb.values()), 1) == 6.0
    # floor at 4.8 TB/s: 6,031,505,408 B / 4.8e12 B/s = 1.2566 ms (weights alone 1.2559 ms)
    m = floor_metrics(got, 4800.0, {"decode_step_ms": 7.06})
    assert m["floor.step_ms"] == pytest.approx((WEIGHTS + 48 * KV_PER_TOKEN) / 4.8e12 * 1e3, rel=1e-12)
    assert round(m["floor.step_ms"], 2) == 1.26
    assert m["floor.step_ratio"] == pytest.approx(7.06 / 1.256564, rel=1e-5)  # 5.6x the floor


def test_a_config_reduced_to_one_rank_reads_what_tp_8_of_the_whole_reads():
    # what `model.tp_rank_of=8` describes: the rank's shapes with TP 1 (MLA's low-rank
    # projections and the router are whole in both)
    rank = kimi(num_attention_heads=8, num_key_value_heads=8, moe_intermediate_size=256,
                intermediate_size=2304, vocab_size=20480)
    for batch in (1, 32):
        assert step_bytes(rank, 1, batch, 100) == step_bytes(kimi(), 8, batch, 100)


def test_active_experts_by_hand():
    assert active_experts(1, 8, 384) == pytest.approx(8)
    # two tokens: 2k minus the expected overlap k^2/E
    assert active_experts(2, 8, 384) == pytest.approx(16 - 64 / 384)
    assert active_experts(0, 8, 384) == 0
    assert active_experts(10_000, 8, 384) == pytest.approx(384)
    with pytest.raises(ValueError, match="top_k"):
        active_experts(1, 400, 384)


def test_batch_32_reads_the_experts_32_tokens_activate():
    got = step_bytes(kimi(), tp=8, batch=32, context_tokens=48)
    # 384 * (1 - (47/48)^32) = 188.23 distinct experts per layer
    experts = 384 * (1 - (47 / 48) ** 32)
    assert round(experts, 2) == 188.23
    assert got["routed_experts"] == pytest.approx(experts * 60 * EXPERT)
    assert got["kv_cache"] == 32 * 48 * KV_PER_TOKEN
    assert got["attention_proj"] == ATTN  # weights are read once whatever the batch


def test_weights_follow_the_quantization():
    bf16 = SimpleNamespace(method="none")
    assert weight_bytes(512, 7168, bf16, 2) == 512 * 7168 * 2
    # an empty method is bf16 too, as validation and the model folder generator read it
    assert weight_bytes(512, 7168, SimpleNamespace(method="", bits=0, group_size=0), 2) == 512 * 7168 * 2
    w4 = SimpleNamespace(method="w4a16", bits=4, group_size=32, scale_dtype="bfloat16")
    assert weight_bytes(512, 7168, w4, 2) == 512 * 7168 / 2 + 512 * 224 * 2
    # unquantized routed experts (tiny_kimi): bf16, like everything else
    tiny = kimi(quant=SimpleNamespace(method="none", bits=16, group_size=0))
    assert step_bytes(tiny, 8, 1, 0)["routed_experts"] == pytest.approx(8 * 60 * 2 * (3 * 256 * 7168),
                                                                        rel=1e-12)
    with pytest.raises(ValueError, match="group_size"):
        weight_bytes(512, 7168, SimpleNamespace(method="w4a16", bits=4, group_size=0,
                                                scale_dtype="bfloat16"), 2)
    with pytest.raises(ValueError, match="not divisible by tp=3"):
        step_bytes(kimi(), 3, 1, 0)


def test_floor_beside_the_issue_profile_of_the_kimi_rank():
    # the issue's profile at c = 1: a 7.06 ms step, MoE 32.5 %, dense GEMM 32.2 %, attention 11.8 %
    m = decode_floor(kimi(), 8, 1, 48, 4800.0, {"decode_step_ms": 7.06, "share_moe": 32.5,
                                                "share_gemm": 32.2, "share_attention": 11.8})
    gemm_bytes = ATTN + DENSE + ROUTER + SHARED + LM_HEAD  # 4,541,775,872 B
    assert m["floor.gemm_ms"] == pytest.approx(gemm_bytes / 4.8e9)  # 0.9462 ms
    assert m["floor.gemm_measured_ms"] == pytest.approx(0.322 * 7.06)  # 2.273 ms
    assert m["floor.gemm_ratio"] == pytest.approx(0.322 * 7.06 / (gemm_bytes / 4.8e9))
    assert round(m["floor.gemm_ratio"], 2) == 2.40
    assert m["floor.moe_ms"] == pytest.approx(ROUTED / 4.8e9)  # 0.3097 ms
    assert round(m["floor.moe_ratio"], 2) == 7.41
    assert m["floor.moe_lower_ms"] == pytest.approx(m["floor.moe_ms"], rel=1e-12)  # one token: exactly top_k experts
    assert m["floor.attention_ms"] == pytest.approx(48 * KV_PER_TOKEN / 4.8e9)
    assert m["floor.read.routed_experts_gb"] == pytest.approx(1.48635648)
    assert (m["floor.batch"], m["floor.tp"], m["floor.active_experts"]) == (1, 8, pytest.approx(8))


def test_batch_32_moe_lower_bound_is_top_k_experts():
    m = decode_floor(kimi(), 8, 32, 48, 4800.0, {"decode_step_ms": 9.5, "share_moe": 41.2})
    assert m["floor.moe_lower_ms"] == pytest.approx(8 * 60 * EXPERT / 4.8e9)
    # the issue's 3.91 ms of MoE at c = 32 is below the uniform-routing floor (7.29 ms): the
    # dummy-weight router did not spread 32 tokens over 188 experts; the ratio says so
    assert m["floor.moe_ms"] == pytest.approx(384 * (1 - (47 / 48) ** 32) * 60 * EXPERT / 4.8e9)
    assert m["floor.moe_ratio"] < 1 < 0.412 * 9.5 / m["floor.moe_lower_ms"]
    assert "floor.attention_ratio" not in m  # no share_attention given: no measured time


def test_every_byte_category_belongs_to_one_trace_category():
    cats = [c for _, cs in TRACE_CATEGORIES.values() for c in cs]
    assert sorted(cats) == sorted(CATEGORIES)


def test_floor_needs_a_bandwidth():
    with pytest.raises(ValueError, match="bandwidth"):
        floor_metrics(dict.fromkeys(CATEGORIES, 1.0), 0.0, {})
