"""Transport vs wait: each collective call's time on a rank, split at the last rank's arrival.

A collective's duration in one rank's trace includes waiting for the slowest rank to arrive.
The ranks of one host record on one clock, so for every call, matched across ranks,

    last              = the latest start of the call over the ranks (the last arrival)
    wait (rank r)     = last − start_r      (≥ 0)
    transport (r)     = end_r − last
    wait + transport  = end_r − start_r, the call's raw duration on r, exactly.

A call that ends on some rank before the last arrival cannot be split (the clocks disagree):
it is left out of the split on every rank, counted as unsplittable, with one warning.

Clock assumed: the host's system clock (CLOCK_REALTIME). Kineto writes `ts` in µs relative to
the trace's `baseTimeNanoseconds` (the system clock floored to a ~3-month interval, so the
same on every rank in practice); writers without that key write absolute µs. The reader
rebases each trace to its own zero and keeps the way back (`Trace.clock_offset_ns`), which is
added here. torch maps its CPU-side TSC readings onto that clock in each process separately,
so ranks can disagree by around a µs: waits that short are noise. Traces of different hosts
do not share a clock and nothing in a trace says which host wrote it: pass one host's ranks.

Calls: the events of the communication categories (the rules' `communication` group, else
the categories named comm_*). CPU traces: each `cpu_op` with its own start and end (not its
self time); when communication operators nest (vllm::all_reduce > _C::shm_allreduce) only
the outermost counts, so a call is counted once. GPU traces: each kernel. A call belongs to
the analysed step in which it starts.

Matching: steps by order when every rank has the same step names (the usual case: each
rank's worker runs the same execute_model calls); otherwise each rank's steps are shifted
against the first rank's by the offset that most time-overlapping steps show (a profiler
that started a step late on one rank), and pairs with different names are dropped. Calls:
the k-th call of a category in a matched step, on every rank. Where the counts differ, the
first ones are matched by order and the rest counted as unmatched, with a warning; calls in
a step without a partner on every rank are unmatched too.

These are raw call durations (a call's whole span, whatever else runs meanwhile), unlike the
exposed, priority-attributed time of `share_comm_*`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from k25exp.traces.intervals import Windows

COMM_GROUP = "communication"


def communication_categories(categories: Sequence[str], groups: dict[str, list[str]]
                             ) -> list[str]:
    return list(groups.get(COMM_GROUP) or [c for c in categories if c.startswith("comm_")])


@dataclass
class CommCalls:
    """One rank's communication calls inside its analysed steps, sorted by (step,
    category, start). Times are on the trace's own zero: add clock_offset_ns for the
    host's clock."""

    mode: str                   # "gpu" | "cpu"
    clock_offset_ns: int
    step_names: list[str]
    step_start_ns: np.ndarray   # [steps]
    step_end_ns: np.ndarray
    step: np.ndarray            # [calls] index of the step the call starts in
    category: np.ndarray        # [calls] index into the rules' categories
    start_ns: np.ndarray        # [calls]
    end_ns: np.ndarray


def outermost(start: np.ndarray, end: np.ndarray, lane: np.ndarray) -> np.ndarray:
    """Mask of the intervals that start inside no earlier interval of their lane (at equal
    starts the longer one is the outer)."""
    keep = np.zeros(start.size, dtype=bool)
    if start.size == 0:
        return keep
    order = np.lexsort((-end, start, lane))
    s, e, ln = start[order], end[order], lane[order]
    cuts = np.flatnonzero(ln[1:] != ln[:-1]) + 1
    for a, b in zip(np.r_[0, cuts].tolist(), np.r_[cuts, s.size].tolist()):
        reach = np.maximum.accumulate(e[a:b])          # latest end so far on this lane
        keep[order[a:b]] = np.r_[True, s[a + 1:b] >= reach[:-1]]
    return keep


def comm_calls(start: np.ndarray, end: np.ndarray, lane: np.ndarray, category: np.ndarray,
               comm: Sequence[int], steps: Windows, step_names: list[str], mode: str,
               clock_offset_ns: int) -> CommCalls:
    """The calls among work events (start, end, lane, category index per event) whose
    category is in `comm`: the outermost per lane, starting inside a step."""
    m = np.isin(category, np.asarray(comm, dtype=category.dtype))
    s, e, ln, c = start[m], end[m], lane[m], category[m]
    outer = outermost(s, e, ln)
    s, e, c = s[outer], e[outer], c[outer]
    step = steps.index(s)
    inside = step >= 0
    s, e, c, step = s[inside], e[inside], c[inside], step[inside]
    order = np.lexsort((s, c, step))
    return CommCalls(mode, int(clock_offset_ns), list(step_names), steps.s.copy(),
                     steps.e.copy(), step[order], c[order].astype(np.int64), s[order], e[order])


@dataclass
class RankSplit:
    """One rank's split: ns per (own step, rules' category), over the matched calls.
    calls_matched + calls_unmatched + calls_unsplittable = every call in the analysed steps."""

    wait_ns: np.ndarray         # [steps, categories] int64
    transport_ns: np.ndarray
    raw_ns: np.ndarray          # Σ (end − start) of the same calls = wait + transport
    calls_matched: np.ndarray   # [categories]
    calls_unmatched: int = 0
    calls_unsplittable: int = 0
    steps_matched: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    # ^ this rank's own indexes of the steps that have a partner on every rank: the steps the
    #   split covers (per-step figures divide by these, not by every analysed step)

    @property
    def calls(self) -> int:
        return int(self.calls_matched.sum()) + self.calls_unmatched + self.calls_unsplittable


@dataclass
class CommSplit:
    ranks: list[RankSplit] = field(default_factory=list)   # empty when there is no split
    steps_matched: int = 0
    reason: str | None = None                               # why there is no split
    warnings: list[str] = field(default_factory=list)


def _step_shift(ref: CommCalls, other: CommCalls) -> int | None:
    """d such that other's step i + d is ref's step i; None if no step overlaps."""
    if other.step_names == ref.step_names:
        return 0
    rs, re_ = ref.step_start_ns + ref.clock_offset_ns, ref.step_end_ns + ref.clock_offset_ns
    os_, oe = other.step_start_ns + other.clock_offset_ns, other.step_end_ns + other.clock_offset_ns
    if os_.size == 0 or rs.size == 0:
        return None
    # Candidates: other's last step starting before ref's step ends, and the one before it.
    j = np.searchsorted(os_, re_, side="left") - 1
    best_j, best = np.full(rs.size, -1), np.zeros(rs.size, dtype=np.int64)
    for cand in (j, j - 1):
        ok = cand >= 0
        cj = np.maximum(cand, 0)
        ov = np.where(ok, np.minimum(re_, oe[cj]) - np.maximum(rs, os_[cj]), 0)
        better = ov > best
        best_j, best = np.where(better, cand, best_j), np.where(better, ov, best)
    has = best_j >= 0
    if not has.any():
        return None
    vals, counts = np.unique(best_j[has] - np.flatnonzero(has), return_counts=True)
    return int(vals[np.argmax(counts)])


def _groups(c: CommCalls, n_cat: int) -> dict[int, dict[int, tuple[np.ndarray, np.ndarray]]]:
    """step -> category -> (starts, ends) on the host's clock, in time order."""
    key = c.step.astype(np.int64) * n_cat + c.category
    out: dict[int, dict[int, tuple[np.ndarray, np.ndarray]]] = {}
    if key.size == 0:
        return out
    cuts = np.flatnonzero(key[1:] != key[:-1]) + 1
    for a, b in zip(np.r_[0, cuts].tolist(), np.r_[cuts, key.size].tolist()):
        j, k = divmod(int(key[a]), n_cat)
        out.setdefault(j, {})[k] = (c.start_ns[a:b] + c.clock_offset_ns,
                                    c.end_ns[a:b] + c.clock_offset_ns)
    return out


def split_ranks(comms: Sequence[CommCalls], labels: Sequence[str], n_cat: int) -> CommSplit:
    """Matches the calls across ranks and splits them (see the module docstring)."""
    if len(comms) < 2:
        return CommSplit(reason="wait/transport split needs the traces of ≥ 2 ranks of one "
                                f"host; got {len(comms)}")
    if len({c.mode for c in comms}) > 1:
        return CommSplit(reason="wait/transport split: the ranks mix GPU and CPU traces")
    ref = comms[0]
    shifts = []
    for c, lb in zip(comms, labels):
        d = _step_shift(ref, c)
        if d is None:
            return CommSplit(reason=f"wait/transport split: no step of {lb} overlaps a step of "
                                    f"{labels[0]} on the shared clock (not one run on one host?)")
        shifts.append(d)
    matched = [tuple(i + d for d in shifts) for i in range(len(ref.step_names))]
    matched = [t for t in matched
               if all(0 <= j < len(c.step_names) and c.step_names[j] == ref.step_names[t[0]]
                      for j, c in zip(t, comms))]
    if not matched:
        return CommSplit(reason="wait/transport split: no analysed step has a partner with the "
                                "same name on every rank")
    out = CommSplit(steps_matched=len(matched))
    for c, lb in zip(comms, labels):
        if len(c.step_names) > len(matched):
            out.warnings.append(f"wait/transport split: {len(c.step_names) - len(matched)} of "
                                f"{len(c.step_names)} steps of {lb} have no partner on every "
                                "rank; their calls are unmatched")
    groups = [_groups(c, n_cat) for c in comms]
    for r, c in enumerate(comms):
        n = len(c.step_names)
        out.ranks.append(RankSplit(np.zeros((n, n_cat), dtype=np.int64),
                                   np.zeros((n, n_cat), dtype=np.int64),
                                   np.zeros((n, n_cat), dtype=np.int64),
                                   np.zeros(n_cat, dtype=np.int64),
                                   steps_matched=np.array([t[r] for t in matched], dtype=np.int64)))
    uneven = 0
    taken = [0] * len(comms)    # calls inside matched steps, per rank
    for t in matched:
        in_step = [g.get(j, {}) for g, j in zip(groups, t)]
        for k in sorted(set().union(*in_step)):
            calls = [g.get(k, (np.zeros(0, np.int64),) * 2) for g in in_step]
            lens = [s.size for s, _ in calls]
            n = min(lens)
            uneven += len(set(lens)) > 1
            for r, ln in enumerate(lens):
                taken[r] += ln
                out.ranks[r].calls_unmatched += ln - n
            if n == 0:
                continue
            s = np.stack([a[:n] for a, _ in calls])         # [ranks, calls]
            e = np.stack([b[:n] for _, b in calls])
            last = s.max(axis=0)
            ok = (e >= last).all(axis=0)                    # else the clocks disagree
            for r, (rs, j) in enumerate(zip(out.ranks, t)):
                rs.wait_ns[j, k] += int((last - s[r])[ok].sum())
                rs.transport_ns[j, k] += int((e[r] - last)[ok].sum())
                rs.raw_ns[j, k] += int((e[r] - s[r])[ok].sum())
                rs.calls_matched[k] += int(ok.sum())
                rs.calls_unsplittable += int((~ok).sum())
    for r, c in enumerate(comms):
        out.ranks[r].calls_unmatched += c.step.size - taken[r]   # calls of unmatched steps
    if uneven:
        per = ", ".join(f"{lb} {rs.calls_unmatched}" for lb, rs in zip(labels, out.ranks))
        out.warnings.append(f"wait/transport split: the ranks made different numbers of calls "
                            f"of a category in {uneven} (step, category) pairs: matched by "
                            f"order, the rest unmatched ({per})")
    bad = out.ranks[0].calls_unsplittable
    if bad:
        out.warnings.append(f"wait/transport split: {bad} calls end on some rank before the last "
                            "rank arrives (the ranks' clocks disagree): left out of the split")
    return out
