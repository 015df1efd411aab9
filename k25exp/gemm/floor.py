"""A decode step's distance to the memory-bandwidth limit: bytes it must read over the GPU's
bandwidth (the floor), beside the time the profile measured, per trace category.

The byte categories (step_bytes.CATEGORIES) are what is read; the trace's categories
(conf/trace_rules/default.yaml) are which kernels read it. Each trace category compared here
reads a known set of byte categories:
  gemm       (gemm_dense + gemm_quantized: nvjet/cuBLAS, Marlin dense) — the attention
             projections (with MLA's absorbed kv_b BMMs), dense MLP, router, shared expert, lm_head
  moe        (fused MoE / Marlin MoE, routing) — the routed experts the batch activates
  attention  (FlashMLA …) — the KV cache
The floor is the datasheet bandwidth's: no kernel reaches it, so a ratio of 1.2–1.5 is
already good; ratios are comparisons between steps and categories, not efficiencies.

Pure Python (no torch, Hydra or MLflow).
"""

from __future__ import annotations

from typing import Any, Mapping

from k25exp.gemm.step_bytes import CATEGORIES, step_bytes, total
from k25exp.model.routing import distinct_experts

# trace category → (the breakdown metric with its share of the step, the byte categories it reads)
TRACE_CATEGORIES: dict[str, tuple[str, tuple[str, ...]]] = {
    "gemm": ("share_gemm", ("attention_proj", "dense_mlp", "router", "shared_expert", "lm_head")),
    "moe": ("share_moe", ("routed_experts",)),
    "attention": ("share_attention", ("kv_cache",)),
}


def bytes_to_ms(n_bytes: float, bandwidth_gbps: float) -> float:
    """Time to move ``n_bytes`` at ``bandwidth_gbps`` GB/s (1e9 B/s), in ms."""
    if bandwidth_gbps <= 0:
        raise ValueError(f"memory bandwidth must be > 0 GB/s, got {bandwidth_gbps}")
    return n_bytes / (bandwidth_gbps * 1e9) * 1e3


def floor_metrics(by_category: Mapping[str, float], bandwidth_gbps: float,
                  breakdown: Mapping[str, float]) -> dict[str, float]:
    """The floor metrics of one profiled step.

    ``by_category``: step_bytes' output; ``breakdown``: the profile's metrics
    (``decode_step_ms`` and ``share_<category>`` in % of the step, mean over ranks).
    Returns ``floor.read.<what>_gb`` / ``_ms`` per byte category, and per trace category
    (and ``step``) ``floor.<category>_ms`` (the floor), ``_measured_ms`` (share × step) and
    ``_ratio`` (measured / floor; left out where the floor is 0).
    """
    out: dict[str, float] = {}
    for cat in CATEGORIES:
        b = by_category[cat]
        out[f"floor.read.{cat}_gb"] = b / 1e9
        out[f"floor.read.{cat}_ms"] = bytes_to_ms(b, bandwidth_gbps)
    step = breakdown.get("decode_step_ms")
    for name, (share_key, cats) in TRACE_CATEGORIES.items():
        fl = bytes_to_ms(sum(by_category[c] for c in cats), bandwidth_gbps)
        out[f"floor.{name}_ms"] = fl
        if step is not None and share_key in breakdown:
            measured = breakdown[share_key] / 100.0 * step
            out[f"floor.{name}_measured_ms"] = measured
            if fl > 0:
                out[f"floor.{name}_ratio"] = measured / fl
    out["floor.step_gb"] = total(by_category) / 1e9
    out["floor.step_ms"] = bytes_to_ms(total(by_category), bandwidth_gbps)
    if step is not None:
        out["floor.step_measured_ms"] = step
        if out["floor.step_ms"] > 0:
            out["floor.step_ratio"] = step / out["floor.step_ms"]
    return out


def decode_floor(model: Any, tp: int, batch: int, context_tokens: float, bandwidth_gbps: float,
                 breakdown: Mapping[str, float], routing: str = "learned") -> dict[str, float]:
    """floor_metrics for ``batch`` sequences of ``context_tokens`` on one rank of TP ``tp``,
    plus the inputs that decide it (``floor.batch``, ``floor.context_tokens``,
    ``floor.active_experts`` per MoE layer, ``floor.tp``, ``floor.mem_bandwidth_gbps``).

    The routed experts' floor reads the distinct experts the batch activates under
    ``routing`` (model.routing; k25exp.model.routing.distinct_experts: uniform for `uniform`
    and, lacking the router's statistics, for `learned`; fewer for `skewed`).
    ``floor.moe_lower_ms`` is the bound no routing can beat: every token on the same top_k
    experts. A ``floor.moe_ratio`` below 1 means the batch activated fewer experts than that
    routing would (an untrained router, ``--load-format dummy`` with routing `learned`,
    concentrates tokens on few experts)."""
    active = distinct_experts(batch, model.num_experts_per_tok, model.n_routed_experts, routing)
    m = floor_metrics(step_bytes(model, tp, batch, context_tokens, experts=active),
                      bandwidth_gbps, breakdown)
    same = step_bytes(model, tp, batch, context_tokens, experts=model.num_experts_per_tok)
    m["floor.moe_lower_ms"] = bytes_to_ms(same["routed_experts"], bandwidth_gbps)
    m.update({"floor.batch": float(batch), "floor.context_tokens": float(context_tokens),
              "floor.active_experts": active,
              "floor.tp": float(tp), "floor.mem_bandwidth_gbps": float(bandwidth_gbps)})
    return m
