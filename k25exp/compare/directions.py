"""Which direction of change is worse, declared once per kind of metric.

First matching rule wins; a metric no rule names has no direction: its change is shown, never
fails `--fail-on`, and the table says so. Rules match the metric's last path component
(`gate_up.tp2/marlin/latency_us` → `latency_us`, `baseline/tpot_ms_p50` → `tpot_ms_p50`).
"""

from __future__ import annotations

import re

LOWER, HIGHER, UNKNOWN = "lower", "higher", "unknown"

# (regex on the name, which is better, what kind of figure it is)
RULES: tuple[tuple[str, str, str], ...] = (
    # no better side: counts, shares, settings, signed gaps, sweep positions
    (r"_n_|gap_pct|share|concurrency|knee|tokens_per_chunk|^(ops|bytes)_per_step$|^completed$"
     r"|^requests$|server_starts|points_measured|^spec_draft|rate_req_s$", UNKNOWN,
     "count / setting / share"),  # rate_req_s: an open loop's target, schedule, achieved pace
    (r"tok_s|request_s|^goodput_req_s$", HIGHER, "throughput"),
    (r"^(max_)?good_(session_)?fraction$", HIGHER, "goodput (share of requests or sessions meeting the SLO)"),
    (r"gbps|busbw|algbw|tflops|roofline_pct", HIGHER, "bandwidth / compute rate"),
    (r"speedup|throughput_gain|accept", HIGHER, "speed-up / acceptance"),
    (r"^valid$|_valid$", HIGHER, "validity flag (1 = valid)"),
    (r"errors|wrong|malformed|stall|lagged|failed|invalid|max_rel_err|missing|refused|^sessions_cut$", LOWER,
     "faults"),
    (r"(_ms|_us)(_|$)|latency|ttft|tpot|itl|e2e|time_us", LOWER, "latency / time"),
    (r"_s$", LOWER, "duration (s)"),
)


def direction(metric: str) -> tuple[str, str]:
    """(LOWER | HIGHER | UNKNOWN, the kind of figure the matching rule names)."""
    name = metric.rsplit("/", 1)[-1]
    for pattern, better, kind in RULES:
        if re.search(pattern, name):
            return better, kind
    return UNKNOWN, "no rule names it"


def is_worse(metric: str, change_pct: float) -> bool:
    """True when the change goes the declared worse way (never for UNKNOWN)."""
    better, _ = direction(metric)
    return (better == LOWER and change_pct > 0) or (better == HIGHER and change_pct < 0)
