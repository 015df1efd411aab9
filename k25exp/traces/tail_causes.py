"""Why was this token slow: a named cause, with its milliseconds, for every gap of the ITL tail.

The tail of a level: every inter-token gap above the level's p99 ITL (when the level has the
samples a p99 needs, k25exp.stats.min_samples) and every gap that ended a delivery stall
(k25exp.load.stalls). Each tail gap's excess over the level's median ITL is split among the
causes its joined parts (k25exp.traces.token_gaps) show, each measured against what a
typical gap of the level holds:

  prefill    the step that made the token carried a prefill (its length above the median
             decoding step), plus steps between that prefilled without decoding anyone:
             a shared prefill
  long_step  the step that made it was a pure decode step longer than the median one (a
             long step of another kind: a larger batch, a slower kernel, a pause inside it)
  skipped    decoding steps the request was left out of (waiting, preempted; inferred:
             no request ids in the trace)
  host_gap   the host gap before that step above the median host gap, plus empty steps
  launch     under async scheduling, the token's step was done but the host was still
             launching the next step, and vLLM hands a step's tokens on only after that
             launch (a host blocked in it, e.g. by a call that waits for the device, holds them)
  delivery   the rest of the growth in its delivery delay (step done → client arrival: the API server,
             the network, the client's event loop: delivery or client lag), plus steps whose
             tokens were merged into this chunk (made on time, delivered together)

A gap whose named parts hold at least its excess has them scaled to it (they then add up to
the excess exactly); one whose parts hold less keeps them and the rest is `unexplained`. Its
cause is the part holding the most. The level's tail decomposed: each cause's ms summed over
the tail gaps, as a share of the summed excess; `caused_pct` = the share held by named
causes (100 − unexplained).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from k25exp.stats import min_samples, percentile
from k25exp.traces.token_gaps import Gap, TokenJoin

CAUSES = ("prefill", "long_step", "skipped", "host_gap", "launch", "delivery")
UNEXPLAINED = "unexplained"
ALL = CAUSES + (UNEXPLAINED,)


@dataclass
class TailGap:
    gap: Gap
    excess_ms: float
    parts: dict[str, float]   # cause → ms of the excess (ALL)
    cause: str
    above_p99: bool


@dataclass
class Tail:
    join: TokenJoin
    p50_ms: float
    p99_ms: Optional[float]   # None below the samples a p99 needs
    threshold_ms: float       # gaps above it are the tail (p99, or a given threshold)
    n: int                    # gaps of the level (joined and not)
    ref_step_ms: float        # the median step that made a token
    ref_host_ms: float        # the median host gap before it
    gaps: list[TailGap]
    unjoined_tail: int = 0    # tail gaps of requests the join could not place
    notes: list[str] = field(default_factory=list)

    def totals(self) -> dict[str, float]:
        return {c: sum(t.parts[c] for t in self.gaps) for c in ALL}

    def excess_ms(self) -> float:
        return sum(t.excess_ms for t in self.gaps)

    def caused_pct(self) -> Optional[float]:
        ex = self.excess_ms()
        return 100.0 * (1 - self.totals()[UNEXPLAINED] / ex) if ex > 0 else None

    def rows(self) -> list[list]:
        """The decomposition table: cause, tail gaps it is the cause of, ms, % of the excess."""
        tot, ex = self.totals(), self.excess_ms()
        rows = [[c, sum(t.cause == c for t in self.gaps), tot[c], 100 * tot[c] / ex if ex else None]
                for c in ALL]
        rows.append(["total", len(self.gaps), ex, 100.0 if ex else None])
        return rows

    def metrics(self, prefix: str = "tail.") -> dict[str, float]:
        m = {"itl_ms_p50": self.p50_ms, "itl_n": float(self.n), "threshold_ms": self.threshold_ms,
             "gaps": float(len(self.gaps)), "stall_gaps": float(sum(t.gap.stall for t in self.gaps)),
             "excess_ms": self.excess_ms(), "ref_step_ms": self.ref_step_ms,
             "ref_host_ms": self.ref_host_ms, "delivery_ms_typical": self.join.delivery_ms,
             "unjoined_requests": float(len(self.join.unjoined)),
             "unjoined_tail_gaps": float(self.unjoined_tail)}
        if self.p99_ms is not None:
            m["itl_ms_p99"] = self.p99_ms
        if (c := self.caused_pct()) is not None:
            m["caused_pct"] = c
        hit, of = self.join.batch_match
        if of:
            m["batch_match_pct"] = 100.0 * hit / of
            m["batch_match_n"] = float(of)
        tot, ex = self.totals(), self.excess_ms()
        for c in ALL:
            m[f"cause.{c}_ms"] = tot[c]
            m[f"cause.{c}_gaps"] = float(sum(t.cause == c for t in self.gaps))
            if ex > 0:
                m[f"cause.{c}_pct"] = 100 * tot[c] / ex
        return {prefix + k: float(v) for k, v in m.items()}


def named_parts(g: Gap, ref_step_ms: float, ref_host_ms: float, own_prefilled: bool) -> dict[str, float]:
    """The ms each cause holds in one gap, measured against a typical gap (module docstring)."""
    own_excess = max(0.0, g.own_ms - ref_step_ms)
    # launch and delivery share the growth of the delivery delay: what grew (net) is named,
    # launch first; a hold released (launch < 0) offsets delivery rather than adding to it
    net = max(0.0, g.launch_ms + g.delivery_ms)
    launch = min(max(0.0, g.launch_ms), net)
    return {"prefill": (own_excess if own_prefilled else 0.0) + g.prefill_ms,
            "long_step": 0.0 if own_prefilled else own_excess,
            "skipped": g.skipped_ms,
            "host_gap": max(0.0, g.host_ms - ref_host_ms) + g.empty_ms,
            "launch": launch,
            "delivery": net - launch + g.merged_ms}


def level_itl(join: TokenJoin) -> list[float]:
    """Every gap of every request the client received (joined or not), ms."""
    return [float(x) for r in join.requests for x in np.diff(r.arrive_ms)]


def tail(join: TokenJoin, threshold_ms: Optional[float] = None) -> Tail:
    """The level's tail and the cause of each of its gaps. `threshold_ms`: the tail is the gaps
    above it (default: the level's p99 ITL; below 100 gaps only the stalls are the tail)."""
    itl = level_itl(join)
    if not itl:
        raise ValueError("no inter-token gaps: no request streamed two chunks")
    p50 = percentile(itl, 50)
    p99 = percentile(itl, 99) if len(itl) >= min_samples(99) else None
    notes = []
    thr = threshold_ms if threshold_ms is not None else (p99 if p99 is not None else float("inf"))
    if threshold_ms is None and p99 is None:
        notes.append(f"{len(itl)} gaps: a p99 needs {min_samples(99)}; the tail is the "
                     "delivery stalls only")
    own = [g.own_ms for g in join.gaps]
    host = [g.host_ms for g in join.gaps]
    ref_step = percentile(own, 50) if own else 0.0
    ref_host = percentile(host, 50) if host else 0.0
    out = []
    for g in join.gaps:
        if not (g.gap_ms > thr or g.stall):
            continue
        excess = max(0.0, g.gap_ms - p50)
        named = named_parts(g, ref_step, ref_host, join.steps[g.step].prefills)
        total = sum(named.values())
        if total >= excess > 0:
            parts = {c: v * excess / total for c, v in named.items()}
            parts[UNEXPLAINED] = 0.0
        else:
            parts = dict(named)
            parts[UNEXPLAINED] = excess - total
        cause = max(ALL, key=lambda c: parts[c]) if excess > 0 else UNEXPLAINED
        out.append(TailGap(g, excess, parts, cause, p99 is not None and g.gap_ms > p99))
    # tail gaps of requests the join could not place: all unexplained
    unjoined = 0
    for r in join.requests:
        if r.i in join.unjoined:
            for k, x in enumerate(np.diff(r.arrive_ms), start=1):
                if x > thr or k in r.stall_chunks:
                    unjoined += 1
                    ex = max(0.0, float(x) - p50)
                    g = Gap(r.i, k, int(r.tokens[k]), float(x), -1, -1, 0.0, 0.0, 0.0, 0.0, 0.0,
                            0.0, 0.0, float("nan"), 0, k in r.stall_chunks, 0.0)
                    out.append(TailGap(g, ex, {**dict.fromkeys(CAUSES, 0.0), UNEXPLAINED: ex},
                                       UNEXPLAINED, p99 is not None and x > p99))
    if join.unjoined:
        notes.append(f"{len(join.unjoined)} request(s) could not be joined to the steps "
                     f"(their tail gaps unexplained): {next(iter(join.unjoined.values()))}")
    return Tail(join, p50, p99, thr, len(itl), ref_step, ref_host, out, unjoined, notes)
