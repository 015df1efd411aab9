"""The ITL tail by cause without a trace: what the client's own records tell, as far as they go.

Where no profiler ran (the macro's levels), nothing says what the engine did in a gap; the
other requests of the level do. For each tail gap of a request (above the level's p99 ITL,
with the samples a p99 needs, or ending a delivery stall, as k25exp.traces.tail_causes picks
them; times on the client's clock), its excess over the level's median ITL goes to:

  delivery  the gap ended in a burst: the chunk ended a delivery stall (load.stalls), carried
            several tokens, or the next chunk came within a tenth of a median gap: the tokens
            were made on time and held back (the API server, the network, the client)
  skipped   the other requests decoding across the whole gap kept receiving tokens inside it
            (at least half of them): the engine stepped, this request was not in its steps
            (waiting, preempted)
  prefill   no one else received a token inside it either, and another request's first token
            (its prefill's end) came in the gap or with its end (within 0.6 of a median gap
            after it: one step's outputs reach the client over a few ms): a shared prefill, the
            gap's cause; with the level's fitted cost per prompt token
            (level_figures.decode_prefills: prefill_shared_us_per_token) the prefill holds that
            many ms of it, the rest goes to engine (the fit averages over every request's
            decode steps: it can price a prefill under what the step that ran it took)
  engine    no one else received a token inside it, no prefill ended in it: the engine paused
            every request, in a long step or a host gap

What it cannot tell (a trace can: k25exp.traces.tail_causes): a long step from a host gap
(both are `engine`), a late delivery from a slow client (both `delivery`), waiting from
preemption (`skipped`: vLLM's `vllm:num_preemptions` over the level, server_preemptions,
says whether any request was preempted), the prefill's real cost (estimated from the fit),
and anything about a gap at concurrency 1 but delivery and engine. The engine's own gaps
(`vllm:inter_token_latency_seconds`, engine-core timestamps before delivery) are only a
histogram: server_itl_ms_p99_le says below which bucket bound 99 % of them stayed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np

from k25exp.stats import min_samples, percentile

CAUSES = ("prefill", "engine", "skipped", "delivery")
# a trace's cause (k25exp.traces.tail_causes) as the client alone can name it
FROM_TRACE = {"prefill": "prefill", "long_step": "engine", "host_gap": "engine",
              "skipped": "skipped", "delivery": "delivery",
              "launch": "engine"}  # the host held every request's tokens: an engine-wide pause


@dataclass
class ClientGap:
    request: int
    chunk: int
    gap_ms: float
    excess_ms: float
    parts: dict[str, float]
    cause: str
    others: int          # other requests decoding across the whole gap
    progressed: int      # of them, those that received a token inside it
    prefills: int        # other requests whose first token came in it
    stall: bool


@dataclass
class ClientTail:
    p50_ms: float
    p99_ms: Optional[float]
    threshold_ms: float
    n: int
    gaps: list[ClientGap]
    notes: list[str] = field(default_factory=list)

    def totals(self) -> dict[str, float]:
        return {c: sum(g.parts[c] for g in self.gaps) for c in CAUSES}

    def metrics(self, prefix: str = "tail_client.") -> dict[str, float]:
        tot = self.totals()
        ex = sum(g.excess_ms for g in self.gaps)
        m = {"itl_ms_p50": self.p50_ms, "itl_n": float(self.n), "gaps": float(len(self.gaps)),
             "excess_ms": ex}
        if self.p99_ms is not None:
            m["itl_ms_p99"] = self.p99_ms
        for c in CAUSES:
            m[f"cause.{c}_ms"] = tot[c]
            m[f"cause.{c}_gaps"] = float(sum(g.cause == c for g in self.gaps))
            if ex > 0:
                m[f"cause.{c}_pct"] = 100 * tot[c] / ex
        return {prefix + k: float(v) for k, v in m.items()}


def _arrivals(records: Sequence[dict]) -> list[tuple[dict, np.ndarray]]:
    out = []
    for r in records:
        if r.get("ok") and r.get("chunk_s"):
            out.append((r, (float(r["sent_s"]) + np.asarray(r["chunk_s"], dtype=float)) * 1e3))
    return out


def client_tail(records: Sequence[dict], threshold_ms: Optional[float] = None,
                prefill_us_per_token: Optional[float] = None) -> Optional[ClientTail]:
    """The level's tail by cause from its records (module docstring); None without a gap.
    `prefill_us_per_token`: the level's fitted cost of a prompt token prefilled inside a
    decode step (level_figures' prefill_shared_us_per_token), to size a shared prefill."""
    reqs = _arrivals(records)
    itl = [float(x) for _, a in reqs for x in np.diff(a)]
    if not itl:
        return None
    p50 = percentile(itl, 50)
    p99 = percentile(itl, 99) if len(itl) >= min_samples(99) else None
    thr = threshold_ms if threshold_ms is not None else (p99 if p99 is not None else float("inf"))
    notes = [] if p99 is not None or threshold_ms is not None else [
        f"{len(itl)} gaps: a p99 needs {min_samples(99)}; the tail is the delivery stalls only"]
    firsts = np.array([a[0] for _, a in reqs])
    lasts = np.array([a[-1] for _, a in reqs])
    prompts = np.array([(r.get("prompt_tokens") or 0) for r, _ in reqs], dtype=float)
    margin = 0.25 * p50
    out = []
    for k, (r, a) in enumerate(reqs):
        stalls = {int(s[0]) for s in r.get("stalls") or []}
        toks = r.get("chunk_tokens") or [1] * a.size
        for j in range(1, a.size):
            g = float(a[j] - a[j - 1])
            stall = j in stalls
            if not (g > thr or stall):
                continue
            lo, hi = a[j - 1], a[j]
            burst = stall or toks[j] > 1 or (j + 1 < a.size and a[j + 1] - a[j] < 0.1 * p50)
            others = [i for i in range(len(reqs)) if i != k and firsts[i] <= lo and lasts[i] >= hi]
            inside = sum(1 for i in others
                         if np.any((reqs[i][1] > lo + margin) & (reqs[i][1] < hi - margin)))
            # a first token that came with this one was made in the same step: one step's
            # outputs reach the client over a few ms (the API server streams them in turn)
            pre = [i for i in range(len(reqs)) if i != k and lo < firsts[i] <= hi + 0.6 * p50]
            excess = max(0.0, g - p50)
            parts = dict.fromkeys(CAUSES, 0.0)
            if burst:
                cause = "delivery"
            elif others and inside * 2 >= len(others):
                cause = "skipped"
            elif pre:
                cause = "prefill"
                if prefill_us_per_token is not None:
                    est = min(excess, float(prompts[pre].sum()) * prefill_us_per_token / 1e3)
                    parts["engine"] = excess - est
                    parts["prefill"] = est
            else:
                cause = "engine"
            if not any(parts.values()):
                parts[cause] = excess
            out.append(ClientGap(int(r.get("i", k)), j, g, excess, parts, cause, len(others),
                                 inside, len(pre), stall))
    return ClientTail(p50, p99, thr, len(itl), out, notes)


def agreement(client: ClientTail, trace_causes: dict[tuple[int, int], str]) -> tuple[int, int]:
    """(tail gaps the client named as the trace did, tail gaps both saw): the client-only
    decomposition checked against the trace's on one level."""
    both = [(g, trace_causes[(g.request, g.chunk)]) for g in client.gaps
            if (g.request, g.chunk) in trace_causes and trace_causes[(g.request, g.chunk)] in FROM_TRACE]
    return sum(FROM_TRACE[t] == g.cause for g, t in both), len(both)
