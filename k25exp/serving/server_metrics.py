"""The server's own view: latency histograms from vLLM's Prometheus `GET /metrics`.

Scraped before and after each level; the difference of a histogram's `_sum` and `_count`
is the mean over the requests that finished in between, which is the level's mean as the
engine measured it (no network, no client in it):

    server_tpot_ms_mean  vllm:request_time_per_output_token_seconds: per request,
                         (last token − first token time) / (output tokens − 1), the same
                         definition as the client's tpot_ms; older vLLM versions only have
                         vllm:time_per_output_token_seconds (per token gap), used as fallback
    server_ttft_ms_mean  vllm:time_to_first_token_seconds (from arrival at the API server)
    server_itl_ms_mean   vllm:inter_token_latency_seconds
    server_e2e_ms_mean   vllm:e2e_request_latency_seconds
"""

from __future__ import annotations

import re
from typing import Optional

HISTOGRAMS = {
    "tpot": ("vllm:request_time_per_output_token_seconds", "vllm:time_per_output_token_seconds"),
    "ttft": ("vllm:time_to_first_token_seconds",),
    "itl": ("vllm:inter_token_latency_seconds",),
    "e2e": ("vllm:e2e_request_latency_seconds",),
}
_LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)')
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse(text: str, model: Optional[str] = None) -> dict[str, float]:
    """{'<histogram>_sum': s, '<histogram>_count': n} summed over engines, for one model."""
    want = {f"{n}{s}" for names in HISTOGRAMS.values() for n in names for s in ("_sum", "_count")}
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        m = _LINE.match(line)
        if not m or m.group(1) not in want:
            continue
        labels = dict(_LABEL.findall(m.group(2) or ""))
        if model and labels.get("model_name", model) != model:
            continue
        try:
            out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(3))
        except ValueError:
            continue
    return out


def level_means(before: dict[str, float], after: dict[str, float]) -> tuple[dict[str, float], dict[str, str]]:
    """Means (ms) of the requests that finished between two scrapes, and which series gave them."""
    figures: dict[str, float] = {}
    sources: dict[str, str] = {}
    for key, names in HISTOGRAMS.items():
        for name in names:
            if f"{name}_count" not in after:
                continue
            n = after[f"{name}_count"] - before.get(f"{name}_count", 0.0)
            s = after[f"{name}_sum"] - before.get(f"{name}_sum", 0.0) if f"{name}_sum" in after else None
            if n > 0 and s is not None:
                figures[f"server_{key}_ms_mean"] = s / n * 1e3
                sources[key] = name
                if key == "e2e":
                    figures["server_requests"] = n
            break
    return figures, sources
