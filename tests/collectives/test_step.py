"""The decode step's collective list, against counts made by hand from vLLM's model code."""

from __future__ import annotations

import pytest

from k25exp.collectives.step import decode_step_ops, uniform_ops


def test_kimi_at_tp8_batch1_by_hand():
    ops = decode_step_ops(7168, 61, 163840, tp=8, tokens=1, dtype_bytes=2)
    # 1 embedding all-reduce + 61 layers × (attention + MoE) + 1 logits all-gather = 124
    assert len(ops) == 124
    assert [o.op for o in ops].count("all_reduce") == 123 and ops[-1].op == "all_gather"
    assert ops[0].name == "embedding" and ops[1].name == "layer0.attn" and ops[2].name == "layer0.mlp"
    assert ops[-2].name == "layer60.mlp" and ops[-1].name == "logits"
    assert {o.nbytes for o in ops[:-1]} == {14336}  # 7168 × 2 B
    # each rank holds 163840 / 8 = 20480 logits; gathered: 8 × 20480 × 2 B = 327,680 B
    assert (ops[-1].numel, ops[-1].nbytes) == (20480, 327680)
    assert sum(o.nbytes for o in ops) == 123 * 14336 + 327680 == 2_091_008
    assert [o.index for o in ops] == list(range(124))


def test_tiny_kimi_at_tp2_batch4_by_hand():
    ops = decode_step_ops(512, 3, 4096, tp=2, tokens=4, dtype_bytes=2)
    assert [o.name for o in ops] == ["embedding", "layer0.attn", "layer0.mlp", "layer1.attn",
                                     "layer1.mlp", "layer2.attn", "layer2.mlp", "logits"]
    assert {o.numel for o in ops[:-1]} == {2048}  # 512 × 4 tokens
    assert (ops[-1].numel, ops[-1].nbytes) == (8192, 32768)  # 4096 / 2 × 4; × 2 ranks × 2 B


def test_seed_burst_and_bad_input():
    seed = uniform_ops(122, 7168, 2)
    assert len(seed) == 122 and {(o.op, o.nbytes) for o in seed} == {("all_reduce", 14336)}
    with pytest.raises(ValueError, match="vocab_size=100 is not divisible by tp=8"):
        decode_step_ops(64, 1, 100, 8, 1, 2)
    with pytest.raises(ValueError, match="logits_op='scatter'"):
        decode_step_ops(64, 1, 128, 8, 1, 2, logits_op="scatter")
