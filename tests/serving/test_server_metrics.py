"""Parsing vLLM's /metrics: latency histograms and the speculative-decoding counters.

The text is in the format vLLM 0.32's Prometheus endpoint writes (copied from a live CPU
server's answer); the live counters are checked in tests/runners/test_spec_decode.py.
"""

from __future__ import annotations

import pytest

from k25exp.serving import server_metrics

BEFORE = """# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="tiny_kimi"} 2.0
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="tiny_kimi"} 6.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="tiny_kimi"} 3.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="tiny_kimi",position="0"} 2.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="tiny_kimi",position="1"} 1.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="tiny_kimi",position="2"} 0.0
vllm:e2e_request_latency_seconds_sum{engine="0",model_name="tiny_kimi"} 1.0
vllm:e2e_request_latency_seconds_count{engine="0",model_name="tiny_kimi"} 2.0
vllm:spec_decode_num_drafts_created{engine="0",model_name="tiny_kimi"} 1.7959537032646163e+09
"""
AFTER = """vllm:spec_decode_num_drafts_total{engine="0",model_name="tiny_kimi"} 22.0
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="tiny_kimi"} 66.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="tiny_kimi"} 45.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="tiny_kimi",position="0"} 18.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="tiny_kimi",position="1"} 15.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="tiny_kimi",position="2"} 12.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="other"} 999.0
vllm:e2e_request_latency_seconds_sum{engine="0",model_name="tiny_kimi"} 3.0
vllm:e2e_request_latency_seconds_count{engine="0",model_name="tiny_kimi"} 4.0
"""


def test_spec_counters_over_an_interval_follow_vllms_definitions():
    figs, _ = server_metrics.level_means(server_metrics.parse(BEFORE, "tiny_kimi"),
                                         server_metrics.parse(AFTER, "tiny_kimi"))
    assert figs["spec_drafts"] == 20 and figs["spec_draft_tokens"] == 60
    assert figs["spec_accepted_tokens"] == 42  # the other model's counter is not summed in
    assert figs["acceptance_rate"] == pytest.approx(42 / 60)
    assert figs["mean_accepted_tokens"] == pytest.approx(42 / 20)
    assert figs["mean_acceptance_length"] == pytest.approx(1 + 42 / 20)
    assert [figs[f"acceptance_pos{i}"] for i in range(3)] == pytest.approx([16 / 20, 14 / 20, 12 / 20])
    assert figs["server_e2e_ms_mean"] == pytest.approx(1000.0)


def test_a_server_without_speculative_decoding_gives_no_spec_figures():
    plain = "\n".join(line for line in AFTER.splitlines() if "spec_decode" not in line)
    figs, _ = server_metrics.level_means({}, server_metrics.parse(plain, "tiny_kimi"))
    assert not [k for k in figs if "accept" in k or k.startswith("spec_")]


def _itl(counts: dict[str, float], preempted: float) -> str:
    """vLLM 0.32's ITL histogram buckets (cumulative) and preemption counter."""
    lab = 'engine="0",model_name="tiny_kimi"'
    return "".join(f'vllm:inter_token_latency_seconds_bucket{{{lab},le="{le}"}} {c}\n'
                   for le, c in counts.items()) + f"vllm:num_preemptions_total{{{lab}}} {preempted}\n"


def test_preemptions_and_the_engines_own_itl_p99_bucket_over_an_interval():
    """200 gaps in the interval: 150 ≤ 25 ms, 48 more ≤ 50 ms (198 = 99 %), 2 ≤ 100 ms: 99 %
    stayed below the 50 ms bound. 3 requests preempted."""
    before = _itl({"0.025": 10, "0.05": 10, "0.1": 10, "+Inf": 10}, 1)
    after = _itl({"0.025": 160, "0.05": 208, "0.1": 210, "+Inf": 210}, 4)
    figs, _ = server_metrics.level_means(server_metrics.parse(before, "tiny_kimi"),
                                         server_metrics.parse(after, "tiny_kimi"))
    assert figs["server_preemptions"] == 3
    assert (figs["server_itl_ms_p99_le"], figs["server_itl_n"]) == (50.0, 200)
    # fewer than 100 gaps: no p99 bound (every percentile carries enough samples)
    few = _itl({"0.025": 60, "0.05": 99, "0.1": 99, "+Inf": 99}, 1)
    figs, _ = server_metrics.level_means({}, server_metrics.parse(few, "tiny_kimi"))
    assert "server_itl_ms_p99_le" not in figs and figs["server_preemptions"] == 1


def cache_text(enabled: str, queries: float, hits: float) -> str:
    """vLLM's cache settings (an info gauge, every CacheConfig field a label) and its prefix
    cache counters, as vLLM 0.32 writes them."""
    return f"""# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{{block_size="16",cache_dtype="auto",enable_prefix_caching="{enabled}",engine="0",gpu_memory_utilization="0.92"}} 1.0
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{{engine="0",model_name="tiny_kimi"}} {queries}
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{{engine="0",model_name="tiny_kimi"}} {hits}
"""


def test_the_prefix_cache_hit_rate_is_over_the_interval_and_says_whether_caching_is_on():
    on, _ = server_metrics.level_means(server_metrics.parse(cache_text("True", 100, 20), "tiny_kimi"),
                                       server_metrics.parse(cache_text("True", 300, 170), "tiny_kimi"))
    # (170 - 20) hit of (300 - 100) looked up
    assert (on["prefix_cache_queries"], on["prefix_cache_hits"]) == (200, 150)
    assert on["prefix_cache_hit_rate"] == pytest.approx(0.75) and on["prefix_caching_enabled"] == 1
    # caching off (vLLM's CPU build for an MLA model): no hit rate, not a misleading 0
    off, _ = server_metrics.level_means(server_metrics.parse(cache_text("False", 0, 0), "tiny_kimi"),
                                        server_metrics.parse(cache_text("False", 0, 0), "tiny_kimi"))
    assert off["prefix_caching_enabled"] == 0 and "prefix_cache_hit_rate" not in off
    # a server that does not say: nothing claimed either way
    plain = server_metrics.parse("\n".join(x for x in cache_text("True", 5, 1).splitlines()
                                           if "cache_config_info" not in x), "tiny_kimi")
    figs, _ = server_metrics.level_means({}, plain)
    assert "prefix_caching_enabled" not in figs and figs["prefix_cache_hit_rate"] == pytest.approx(0.2)
