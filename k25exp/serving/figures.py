"""Per-level figures from the per-request records, with the definitions they follow.

Per request (the client's clock, seconds after the request was sent):
    ttft     first streamed chunk that carries output tokens
    e2e      last chunk that carries output tokens (vLLM bench's E2EL)
    tpot     (e2e − ttft) / (output tokens − 1): vLLM's TPOT; output tokens from the
             server's `usage` (continuous_usage_stats gives each chunk's count too);
             requests with fewer than 2 output tokens have none
    itl      each gap between consecutive token-carrying chunks (vLLM's ITL; one chunk
             carrying several tokens, as with speculative decoding, makes one long gap)
    tokens_per_chunk  (output tokens − 1) / (token-carrying chunks − 1), over the level's
             requests: tokens per decode step as the client saw them (1 without speculative
             decoding, 1 + accepted with it, as long as the server streams each step as it
             happens: at batch 1 it does)
Per level (requests that failed count in `errors` only):
    output_tok_s   Σ output tokens / wall time of the level (first send → last response)
    request_s      successful requests / wall time
    client_lag_ms_p99   p99 of (actual − scheduled send time), the scheduled time of a
                   worker's next request being the end of its previous response
    client_loop_lag_ms_mean/p50/p99  how late the client's event loop woke a 10 ms sleeper:
                   chunk arrival times are stamped that late. Its p99 also shows the client
                   being preempted (on a CPU box the server's threads share its cores)
    client_cpu_util     client process CPU seconds / wall seconds (1.0 = one core)
    valid          1 unless the client lagged: client_lag_ms_p99 or client_loop_lag_ms_mean
                   above max_client_lag_ms, or client_cpu_util above 0.9 (one event loop
                   near a full core). Then the level measured the client, not the server.
    tpot_gap_pct   (client mean TPOT − server mean TPOT) / server's, % (tpot_gap_pct())
Percentiles are linear interpolation between order statistics (numpy's default).
"""

from __future__ import annotations

from typing import Optional, Sequence

from k25exp.stats import mean, percentile

MAX_CLIENT_CPU = 0.9  # of one core: beyond it the single event loop is the bottleneck


def _pcts(prefix: str, xs: Sequence[float], qs: Sequence[int], scale: float = 1e3) -> dict:
    if not xs:
        return {}
    out = {f"{prefix}_p{q}": percentile(xs, q) * scale for q in qs}
    out[f"{prefix}_mean"] = mean(xs) * scale
    return out


def level_figures(records: Sequence[dict], wall_s: float, cpu_s: Optional[float] = None,
                  loop_lag_ms: Sequence[float] = (), max_client_lag_ms: float = float("inf"),
                  target_output: Optional[int] = None, target_input: Optional[int] = None) -> dict:
    ok = [r for r in records if r["ok"]]
    m: dict[str, float] = {"requests": len(records), "completed": len(ok),
                           "errors": len(records) - len(ok),
                           "malformed_chunks": sum(r.get("malformed", 0) for r in records),
                           "wall_s": wall_s}
    m.update(_pcts("ttft_ms", [r["ttft_s"] for r in ok], (50, 90, 99)))
    m.update(_pcts("tpot_ms", [r["tpot_s"] for r in ok if r["tpot_s"] is not None], (50, 90, 99)))
    itl = [b - a for r in ok for a, b in zip(r["chunk_s"], r["chunk_s"][1:])]
    m.update(_pcts("itl_ms", itl, (50, 99)))
    m.update(_pcts("e2e_ms", [r["e2e_s"] for r in ok], (50, 99)))
    multi = [r for r in ok if r["output_tokens"] and len(r["chunk_s"]) >= 2]
    if multi:
        m["tokens_per_chunk"] = (sum(r["output_tokens"] - 1 for r in multi)
                                 / sum(len(r["chunk_s"]) - 1 for r in multi))
    out_tokens = sum(r["output_tokens"] or 0 for r in ok)
    m["output_tokens"] = out_tokens
    m["output_tok_s"] = out_tokens / wall_s if wall_s > 0 else 0.0
    m["request_s"] = len(ok) / wall_s if wall_s > 0 else 0.0
    if target_output is not None:
        m["output_tokens_mismatch"] = sum(r["output_tokens"] != target_output for r in ok)
    if target_input is not None:
        m["prompt_tokens_mismatch"] = sum(r["prompt_tokens"] is not None
                                          and r["prompt_tokens"] != target_input for r in ok)
    lags = [r["lag_ms"] for r in records if r.get("lag_ms") is not None]
    if lags:
        m["client_lag_ms_p50"] = percentile(lags, 50)
        m["client_lag_ms_p99"] = percentile(lags, 99)
        m["client_lag_ms_max"] = max(lags)
    if loop_lag_ms:
        m["client_loop_lag_ms_p50"] = percentile(loop_lag_ms, 50)
        m["client_loop_lag_ms_p99"] = percentile(loop_lag_ms, 99)
        m["client_loop_lag_ms_mean"] = mean(loop_lag_ms)
    if cpu_s is not None and wall_s > 0:
        m["client_cpu_util"] = cpu_s / wall_s  # 1.0 = one core busy all the time
    m["valid"] = float(m.get("client_lag_ms_p99", 0.0) <= max_client_lag_ms
                       and m.get("client_loop_lag_ms_mean", 0.0) <= max_client_lag_ms
                       and m.get("client_cpu_util", 0.0) <= MAX_CLIENT_CPU)
    return m


def tpot_gap_pct(figs: dict) -> Optional[float]:
    """(client's mean TPOT − server's mean TPOT) / server's, in %. Both follow the same
    definition, so the gap is delivery delay on top of the engine's: chunks held back by a busy
    API process, or a client that lagged. None without the server's figure."""
    client, server = figs.get("tpot_ms_mean"), figs.get("server_tpot_ms_mean")
    if client is None or not server:
        return None
    return (client - server) / server * 100


def saturation(levels: Sequence[int], tok_s: Sequence[float], gain: float) -> Optional[int]:
    """First level after which throughput grows by less than `gain` (a fraction) at the next
    level; None when it still grows by more at the last step of the sweep."""
    pts = sorted(zip(levels, tok_s))
    for (c, t), (_, t_next) in zip(pts, pts[1:]):
        if t_next < t * (1 + gain):
            return c
    return None
