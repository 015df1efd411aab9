"""Delivery stalls: tokens the engine made on time but the client received late, in a burst.

A decode step makes at most one chunk per request, so two chunks of one request can never be
made closer together than a decode step. When the client sees a run of chunks arriving far
closer than that (a *burst*) right after a silence, the chunks were held back somewhere between
the engine and the client (the API server's process preempted on busy cores, a proxy, the
network) and released together. The engine's own latency histograms never see this; the
client's TTFT/TPOT/E2E do, which is what a user sees too.

Definitions (per request, token-carrying chunks at times t0 < t1 < …; the reference decode
step `step` is the engine's own mean TPOT over the level (vLLM's /metrics histogram) when the
server gives it, else the median of the level's request TPOTs: a request's TPOT is its mean
chunk gap, which a stall does not shrink since the silence pays for the burst, though it does
collapse when a request's whole stream arrives in one burst):
    burst   a maximal run of ≥ `min_chunks` chunks, each within `burst_frac` × step of the one
            before it
    stall   a burst whose first chunk follows a silence of ≥ max(2 × step, `min_gap_ms`);
            its length is that silence (ms). A burst that starts at the first chunk (held back
            before the first token arrived: TTFT took it) has no silence to measure; its length
            is estimated as (burst chunks − 1) × step, the time those chunks should have taken.
vLLM also merges outputs that pile up before its API server streams them into one chunk
carrying several tokens; without speculative decoding that shows as tokens_per_chunk > 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import median
from typing import Optional, Sequence


@dataclass(frozen=True)
class StallRule:
    burst_frac: float = 0.1  # a burst's gaps are below this fraction of a decode step
    min_chunks: int = 3  # chunks in a burst, the one that ends the silence included
    min_gap_ms: float = 5.0  # shorter silences are never stalls (floor for tiny steps)


@dataclass(frozen=True)
class Stall:
    chunk: int  # index of the chunk that ended the silence (the burst's first)
    gap_ms: float  # the silence before the burst (estimated when chunk == 0)
    burst_chunks: int

    def as_list(self) -> list:
        return [self.chunk, round(self.gap_ms, 3), self.burst_chunks]


def find_stalls(chunk_s: Sequence[float], step_s: float, rule: StallRule = StallRule()) -> list[Stall]:
    """The stalls in one request's token-chunk arrival times (seconds), given the decode step."""
    if step_s <= 0 or len(chunk_s) < rule.min_chunks:
        return []
    short = rule.burst_frac * step_s
    long_ = max(2 * step_s, rule.min_gap_ms / 1e3)
    stalls = []
    a, n = 0, len(chunk_s)
    while a < n:
        b = a  # extend the burst [a..b] while the next chunk comes within `short`
        while b + 1 < n and chunk_s[b + 1] - chunk_s[b] < short:
            b += 1
        size = b - a + 1
        if size >= rule.min_chunks:
            if a == 0:
                stalls.append(Stall(0, (size - 1) * step_s * 1e3, size))
            elif chunk_s[a] - chunk_s[a - 1] >= long_:
                stalls.append(Stall(a, (chunk_s[a] - chunk_s[a - 1]) * 1e3, size))
        a = b + 1
    return stalls


def level_step_s(records: Sequence[dict]) -> Optional[float]:
    """The level's reference decode step: the median TPOT of its successful requests."""
    tpots = [r["tpot_s"] for r in records if r.get("ok") and r.get("tpot_s")]
    return median(tpots) if tpots else None


def mark(records: Sequence[dict], rule: StallRule = StallRule(),
         step_s: Optional[float] = None) -> Optional[float]:
    """Adds `stalls` ([[chunk, gap_ms, burst_chunks], …]) to every successful record of one
    level (failed ones get []), against `step_s` (the engine's own TPOT, when the caller has
    it) or else the level's median request TPOT; returns the step used (s)."""
    step = step_s or level_step_s(records)
    for r in records:
        found = find_stalls(r.get("chunk_s") or [], step, rule) if step and r.get("ok") else []
        r["stalls"] = [s.as_list() for s in found]
    return step


def figures(records: Sequence[dict]) -> dict[str, float]:
    """Per-level stall figures from records that `mark` annotated."""
    ok = [r for r in records if r.get("ok")]
    gaps = [s[1] for r in ok for s in r.get("stalls", ())]
    return {"delivery_stalls": len(gaps),
            "stalled_requests": sum(1 for r in ok if r.get("stalls")),
            "delivery_stall_ms_max": max(gaps, default=0.0),
            "delivery_stall_ms_total": sum(gaps)}
