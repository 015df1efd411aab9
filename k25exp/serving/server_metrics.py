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

What a tail's causes can be told from without a trace (k25exp.load.tail_client), over the
same interval:

    server_preemptions    requests the engine preempted (vllm:num_preemptions): 0 says no
                          request was left out of steps by preemption (waiting still can)
    server_itl_ms_p99_le  the bucket bound of vllm:inter_token_latency_seconds (the engine's
                          own gaps, engine-core timestamps: no delivery in them) below which
                          99 % of the interval's gaps stayed; server_itl_n of them (logged with
                          ≥ 100 gaps, and only when that bound is finite)

Speculative decoding (counters, only on a server started with --speculative-config), over
the same interval and with vLLM's own definitions (vllm/v1/spec_decode/metrics.py):

    spec_drafts             verification steps that carried a draft (vllm:spec_decode_num_drafts)
    spec_draft_tokens       draft tokens proposed (…_num_draft_tokens)
    spec_accepted_tokens    draft tokens the target accepted (…_num_accepted_tokens)
    acceptance_rate         spec_accepted_tokens / spec_draft_tokens
    mean_accepted_tokens    spec_accepted_tokens / spec_drafts: draft tokens kept per step
    mean_acceptance_length  1 + mean_accepted_tokens: tokens emitted per verification step
    acceptance_pos<i>       accepted at draft position i / spec_drafts (…_per_pos, label
                            `position`); non-increasing in i, since position i is only
                            accepted after every position before it

The prefix cache, over the same interval: prefix_cache_queries and prefix_cache_hits (prompt
tokens looked up and found: vllm:prefix_cache_queries / _hits), prefix_cache_hit_rate (hits /
queries), and prefix_caching_enabled (vllm:cache_config_info's enable_prefix_caching label:
vLLM's CPU build turns caching off for an MLA model such as the tiny Kimi, and then no hit
rate is given rather than a misleading 0).
"""

from __future__ import annotations

from typing import Optional

from prometheus_client.parser import text_string_to_metric_families

HISTOGRAMS = {
    "tpot": ("vllm:request_time_per_output_token_seconds", "vllm:time_per_output_token_seconds"),
    "ttft": ("vllm:time_to_first_token_seconds",),
    "itl": ("vllm:inter_token_latency_seconds",),
    "e2e": ("vllm:e2e_request_latency_seconds",),
}
SPEC_COUNTERS = {
    "vllm:spec_decode_num_drafts_total": "spec_drafts",
    "vllm:spec_decode_num_draft_tokens_total": "spec_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens_total": "spec_accepted_tokens",
}
SPEC_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
PREEMPTIONS = "vllm:num_preemptions_total"
ITL_BUCKET = "vllm:inter_token_latency_seconds_bucket"
# Prefix cache, in tokens: queried (looked up) and hit, over the level
PREFIX_CACHE = {"vllm:prefix_cache_queries_total": "prefix_cache_queries",
                "vllm:prefix_cache_hits_total": "prefix_cache_hits"}
# Whether the engine caches prefixes at all: vLLM's cache settings as labels of an info gauge
# (its CPU build turns caching off for an MLA model, whatever was asked)
CACHE_INFO = "vllm:cache_config_info"
CACHING_ON = "prefix_caching_enabled"


def parse(text: str, model: Optional[str] = None) -> dict[str, float]:
    """{'<histogram>_sum': s, '<histogram>_count': n, '<spec counter>': v,
    '<per-position counter>[i]': v} summed over engines, for one model. Text that is not in
    Prometheus' exposition format raises ValueError (prometheus_client's parser)."""
    want = {f"{n}{s}" for names in HISTOGRAMS.values() for n in names for s in ("_sum", "_count")}
    want |= (set(SPEC_COUNTERS) | {SPEC_PER_POS} | set(PREFIX_CACHE) | {PREEMPTIONS, ITL_BUCKET}
             | {CACHE_INFO})
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name not in want:
                continue
            if model and sample.labels.get("model_name", model) != model:
                continue
            if sample.name == CACHE_INFO:  # 1 per engine: on where any engine caches
                on = float(sample.labels.get("enable_prefix_caching") == "True")
                out[CACHING_ON] = max(out.get(CACHING_ON, 0.0), on)
                continue
            key = sample.name
            if key == SPEC_PER_POS:
                key = f"{key}[{sample.labels.get('position', '?')}]"
            elif key == ITL_BUCKET:
                key = f"{key}[{sample.labels.get('le', '?')}]"
            out[key] = out.get(key, 0.0) + float(sample.value)
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
    figures.update(spec_figures(before, after))
    figures.update(prefix_cache_figures(before, after))
    figures.update(engine_figures(before, after))
    return figures, sources


def engine_figures(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """server_preemptions and server_itl_ms_p99_le / server_itl_n over the interval (module
    docstring); {} for what the server does not export."""
    out: dict[str, float] = {}
    if PREEMPTIONS in after:
        out["server_preemptions"] = after[PREEMPTIONS] - before.get(PREEMPTIONS, 0.0)
    prefix = ITL_BUCKET + "["
    bounds = []
    for k in after:
        if k.startswith(prefix):
            try:
                bounds.append((float(k[len(prefix):-1]), after[k] - before.get(k, 0.0)))
            except ValueError:
                continue
    bounds.sort()
    if bounds and bounds[-1][0] == float("inf") and bounds[-1][1] >= 100:
        n = bounds[-1][1]
        le = next(b for b, c in bounds if c >= 0.99 * n)
        if le != float("inf"):
            out["server_itl_ms_p99_le"] = le * 1e3
            out["server_itl_n"] = n
    return out


def prefix_cache_figures(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """prefix_cache_hit_rate = prompt tokens found in the prefix cache / tokens looked up, over
    the level (vLLM's counters); {} when the server exports none. prefix_caching_enabled: 1 or
    0 as the server's cache settings say (absent where it does not say); with caching off
    there is no hit rate, not a rate of 0."""
    out = {CACHING_ON: after[CACHING_ON]} if CACHING_ON in after else {}
    if not all(k in after for k in PREFIX_CACHE):
        return out
    d = {short: after[name] - before.get(name, 0.0) for name, short in PREFIX_CACHE.items()}
    out.update(d)
    if d["prefix_cache_queries"] > 0 and out.get(CACHING_ON) != 0:
        out["prefix_cache_hit_rate"] = d["prefix_cache_hits"] / d["prefix_cache_queries"]
    return out


def spec_figures(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Speculative-decoding figures over the interval between two scrapes ({} without any)."""
    if not any(k in after for k in SPEC_COUNTERS):
        return {}
    d = {short: after.get(name, 0.0) - before.get(name, 0.0) for name, short in SPEC_COUNTERS.items()}
    out = dict(d)
    if d["spec_draft_tokens"] > 0:
        out["acceptance_rate"] = d["spec_accepted_tokens"] / d["spec_draft_tokens"]
    if d["spec_drafts"] > 0:
        out["mean_accepted_tokens"] = d["spec_accepted_tokens"] / d["spec_drafts"]
        out["mean_acceptance_length"] = 1.0 + out["mean_accepted_tokens"]
        prefix = SPEC_PER_POS + "["
        for k in sorted((k for k in after if k.startswith(prefix)), key=lambda k: int(k[len(prefix):-1])
                        if k[len(prefix):-1].isdigit() else 1 << 30):
            pos = k[len(prefix):-1]
            out[f"acceptance_pos{pos}"] = (after[k] - before.get(k, 0.0)) / d["spec_drafts"]
    return out
