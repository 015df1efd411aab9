"""The profile runner's floor.* metrics, from the composed config a profile run sees (no
server: the breakdown's figures are given)."""

from __future__ import annotations

import pytest

from k25exp.config.validate import to_typed
from k25exp.runners.profile import step_floor
from k25exp.tracking.recorder import MemoryRecorder
from tests.conftest import compose_cfg
from tests.gemm.test_step_bytes import KV_PER_TOKEN, ROUTED, WEIGHTS


def cfg(*overrides: str):
    # Kimi without its checkpoint: vLLM's random weights (the byte count reads the config only)
    return to_typed(compose_cfg("experiment=profile", "server.load_format=dummy", *overrides),
                    gpu_count=lambda: 8)


def test_kimi_at_tp_8_on_the_h200_box_logs_the_hand_counted_floor():
    c = cfg("model=kimi_k25_int4", "hardware=h200_x8_nvlink", "experiment.concurrency=1",
            "experiment.input_tokens=32", "experiment.output_tokens=32")
    rec = MemoryRecorder()
    m = step_floor(c, {"decode_step_ms": 7.06, "share_moe": 32.5, "share_gemm": 32.2,
                       "share_attention": 11.8}, rec)
    # decode steps of a 32-in/32-out request read 33 … 63 cached tokens: 48 on average
    assert m["floor.context_tokens"] == 48
    assert m["floor.step_ms"] == pytest.approx((WEIGHTS + 48 * KV_PER_TOKEN) / 4.8e9)
    assert m["floor.moe_ratio"] == pytest.approx(0.325 * 7.06 / (ROUTED / 4.8e9))
    assert (m["floor.tp"], m["floor.batch"], m["floor.mem_bandwidth_gbps"]) == (8, 1, 4800)
    assert not rec.tags


def test_the_server_tp_is_the_divisor():
    # the same model served at TP 1 (one rank holds everything): attention whole, 8x the experts
    one = step_floor(cfg("model=kimi_k25_int4", "hardware=h200_x1"), {}, MemoryRecorder())
    eight = step_floor(cfg("model=kimi_k25_int4", "hardware=h200_x8_nvlink"), {}, MemoryRecorder())
    assert one["floor.tp"] == 1
    assert one["floor.read.routed_experts_gb"] == pytest.approx(8 * eight["floor.read.routed_experts_gb"])
    assert one["floor.read.router_gb"] == eight["floor.read.router_gb"]  # replicated
    assert "floor.step_ratio" not in one  # no measured step given


def test_a_model_the_byte_count_cannot_shard_is_a_tag_not_a_failure():
    # a server launched at a TP that does not divide the heads is refused by the config
    # (k25exp.config.server_checks); one attached to (server=endpoint) runs at its owner's TP
    rec = MemoryRecorder()
    c = cfg("model=kimi_k25_int4", "hardware=h200_x8_nvlink", "model.num_attention_heads=12",
            "server=endpoint", "server.base_url=http://gpu-box:8000", "server.tokenizer=/models/k2",
            "experiment.trace_dir=/traces")
    assert c.server.tp == 8
    assert step_floor(c, {"decode_step_ms": 1.0}, rec) == {}
    assert "not divisible by tp=8" in rec.tags["floor.error"]


def test_one_tp8_rank_served_on_one_gpu_reads_the_hand_counted_bytes():
    # model.tp_rank_of=8 on hardware=h200_x1: the rank's shapes at server.tp 1
    c = cfg("model=kimi_k25_int4", "model.tp_rank_of=8", "hardware=h200_x1",
            "experiment.concurrency=1", "experiment.input_tokens=32", "experiment.output_tokens=32")
    assert c.server.tp == 1
    m = step_floor(c, {"decode_step_ms": 7.06}, MemoryRecorder())
    assert m["floor.step_ms"] == pytest.approx((WEIGHTS + 48 * KV_PER_TOKEN) / 4.8e9)
    assert m["floor.tp"] == 1
