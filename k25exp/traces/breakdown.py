"""Per-step, per-category busy time of each rank's trace, and figures across ranks.

What counts as work:
* GPU traces, or any device's (a kernel / gpu_memcpy / gpu_memset event, MTIA's
  mtia_ccp_events: reader.DEVICE_CATS): device activity on every stream of the rank;
  host-side operators are ignored. Events of kinds the reader does not recognise are
  counted and named in a warning, not analysed.
* CPU-only traces (vLLM's CPU build): `cpu_op` events on every thread, each instant owned by
  the innermost operator running then (self time), so nested operators count once.

Per step window and category: busy = the union of the category's intervals clipped to the
window (a kernel cut by a step boundary counts only its part inside). `work` = the union of
all categories; `idle` = step length − work.

Overlap (two streams or threads busy at once with different categories) is attributed by
priority: each instant goes to the first busy category in the rules' `categories` order
(default: compute categories first, communication last, so a communication share is the
*exposed* communication time). These exclusive shares plus idle add up to 100 % of the step
exactly. Each category's own union (`raw_busy`) is reported too, and `overlap_share` =
(Σ raw busy − work) / step time: the time counted more than once by the raw figures.

Averages over steps are time-weighted: share = Σ_steps busy / Σ_steps step length.
Across ranks: the headline figure is the mean over ranks (so shares still add to 100 %),
with min / median / max beside it; steps_analysed is the minimum over ranks.

With the traces of ≥ 2 ranks of one host, each collective call is also split into the time
spent waiting for the last rank to arrive and the rest, transport (k25exp.traces.comm_split):
share_comm_wait / share_comm_transport are % of the same step time, but of the calls' raw
durations, not of the exposed time above, so they are not part of the 100 %.

Long because the per-rank breakdown, its result types and the cross-rank figures form one
analysis; the cross-rank split (comm_split), gloo's worker spans (gloo), the reader and
the rules are modules of their own.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from k25exp import stats
from k25exp.traces import collectives, gloo, ranks
from k25exp.traces.comm_split import (
    CommCalls,
    CommSplit,
    RankSplit,
    comm_calls,
    communication_categories,
    split_ranks,
)
from k25exp.traces.intervals import Windows, self_time_segments, union
from k25exp.traces.reader import (
    CPU_CATS,
    DEFAULT_CHUNK_BYTES,
    DEVICE_CATS,
    Trace,
    TraceError,
    read_trace,
    unrecognised_text,
)
from k25exp.traces.rules import Rules, load_rules
from k25exp.traces.step_phases import StepPhases, step_phases
from k25exp.traces.steps import Step, between_steps_ns, select_steps

IDLE = "idle"


@dataclass
class KernelStat:
    name: str
    category: str
    calls: int          # events starting inside an analysed step
    total_us: float     # time inside analysed steps (self time for CPU operators)

    @property
    def mean_us(self) -> float:
        return self.total_us / self.calls if self.calls else 0.0


@dataclass
class RankBreakdown:
    label: str
    path: str
    rank: int | None
    mode: str                       # "gpu" (device work, any accelerator) | "cpu"
    step_source: str                # gpu_user_annotation | user_annotation | window
    categories: list[str]
    groups: dict[str, list[str]]
    steps: list[Step]
    step_ns: np.ndarray             # [steps]
    busy_ns: np.ndarray             # [steps, categories], exclusive (priority-attributed)
    raw_busy_ns: np.ndarray         # [steps, categories], each category's own union
    work_ns: np.ndarray             # [steps], union of all work
    kernels: list[KernelStat]       # by total time, descending
    annotated_steps: int = 0
    decode_steps: int = 0
    events_total: int = 0
    events_kept: int = 0
    bytes_read: int = 0
    read_s: float = 0.0
    analyse_s: float = 0.0
    warnings: list[str] = field(default_factory=list)
    comm: CommCalls | None = None           # communication calls, for the cross-rank split
    prefill_steps: int = 0                  # steps with a prefill (steps.StepSelection)
    prefill_ns: int = 0
    prefill_tokens: int = 0
    comm_split: RankSplit | None = None     # set by analyze() when the ranks could be matched
    steps_grown: int = 0                    # GPU: steps extended over a trailing collective
    gloo_ext: gloo.Extension | None = None  # CPU traces: collectives given their gloo worker's end
    collectives: dict[str, int] | None = None  # GPU: how collective kernels were attributed
    world_size: int | None = None           # distributedInfo.world_size, if recorded
    device_events: dict[str, int] = field(default_factory=dict)  # device work events, by kind
    unrecognised: dict[str, int] = field(default_factory=dict)   # events of unknown kinds, uncounted
    phases: StepPhases | None = None        # the step's cycle by vLLM's scopes, if recorded

    @property
    def steps_analysed(self) -> int:
        return len(self.steps)

    @property
    def total_step_ns(self) -> float:
        return float(self.step_ns.sum())

    @property
    def decode_step_ms(self) -> float:
        return float(self.step_ns.mean()) / 1e6 if self.step_ns.size else 0.0

    def shares(self) -> dict[str, float]:
        """Exclusive share of step time per category, plus idle (they sum to 100)."""
        t = self.total_step_ns
        out = {c: 100.0 * float(self.busy_ns[:, i].sum()) / t for i, c in enumerate(self.categories)}
        out[IDLE] = 100.0 * float((self.step_ns - self.work_ns).sum()) / t
        return out

    def group_shares(self) -> dict[str, float]:
        sh = self.shares()
        return {g: sum(sh[c] for c in members) for g, members in self.groups.items()}

    def raw_shares(self) -> dict[str, float]:
        t = self.total_step_ns
        return {c: 100.0 * float(self.raw_busy_ns[:, i].sum()) / t
                for i, c in enumerate(self.categories)}

    @property
    def overlap_share(self) -> float:
        return 100.0 * float(self.raw_busy_ns.sum() - self.work_ns.sum()) / self.total_step_ns

    def busy_ms(self) -> dict[str, float]:
        """Mean exclusive busy time per step, per category (ms)."""
        n = max(1, self.steps_analysed)
        out = {c: float(self.busy_ns[:, i].sum()) / n / 1e6 for i, c in enumerate(self.categories)}
        out[IDLE] = float((self.step_ns - self.work_ns).sum()) / n / 1e6
        return out

    def comm_split_metrics(self) -> dict[str, float]:
        """Wait / transport of the split collective calls: % of the time of the steps the
        split covers (those matched on every rank) and ms per such step. Raw call durations,
        not exposed time: wait + transport = raw. Coverage beside them: the steps matched
        (% of analysed steps) and the calls split (% of every call in the analysed steps;
        the rest are unmatched or unsplittable). Empty without a split."""
        sp = self.comm_split
        if sp is None:
            return {}
        covered = sp.steps_matched
        t, n = float(self.step_ns[covered].sum()), covered.size
        wait, transport, raw = (float(a.sum()) for a in (sp.wait_ns, sp.transport_ns, sp.raw_ns))
        out = {"comm_steps_matched": float(n),
               "comm_steps_matched_pct": 100.0 * n / max(1, self.steps_analysed),
               "comm_calls": float(sp.calls),
               "comm_calls_matched": float(sp.calls_matched.sum()),
               "comm_calls_unmatched": float(sp.calls_unmatched),
               "comm_calls_unsplittable": float(sp.calls_unsplittable),
               "comm_calls_split_pct": 100.0 * float(sp.calls_matched.sum()) / sp.calls
               if sp.calls else 100.0}
        if n:
            out.update({"share_comm_wait": 100.0 * wait / t,
                        "share_comm_transport": 100.0 * transport / t,
                        "comm_wait_ms_per_step": wait / n / 1e6,
                        "comm_transport_ms_per_step": transport / n / 1e6,
                        "comm_raw_ms_per_step": raw / n / 1e6})
        return out

    def metrics(self) -> dict[str, float]:
        m: dict[str, float] = {"decode_step_ms": self.decode_step_ms,
                               "steps_analysed": float(self.steps_analysed)}
        for c, v in self.shares().items():
            m[f"share_{c}"] = v
        for g, v in self.group_shares().items():
            m[f"share_{g}"] = v
        m["allreduce_share"] = m.get("share_comm_allreduce", 0.0)
        m["overlap_share"] = self.overlap_share
        gaps = between_steps_ns(self.steps)
        if gaps:  # median host gap between consecutive steps: outside every step's 100 %
            m["between_steps_ms"] = stats.median(gaps) / 1e6
        if self.prefill_tokens:  # the window's prefill steps: their time per prompt token
            m["prefill_steps"] = float(self.prefill_steps)
            m["prefill_us_per_token"] = self.prefill_ns / self.prefill_tokens / 1e3
        m.update(self.comm_split_metrics())
        if self.phases is not None:
            m.update(self.phases.metrics())
        return m


@dataclass
class Analysis:
    ranks: list[RankBreakdown]
    rules: Rules
    max_steps: int | None = None
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)      # e.g. why there is no wait/transport split
    comm_split: CommSplit | None = None
    rank_set: ranks.RankSet | None = None   # which ranks of how many (distributedInfo)

    @property
    def categories(self) -> list[str]:
        return list(self.rules.categories)

    def across_ranks(self) -> dict[str, dict[str, float]]:
        """metric -> {mean, min, median, max} over ranks."""
        per = [r.metrics() for r in self.ranks]
        out: dict[str, dict[str, float]] = {}
        for k in dict.fromkeys(k for p in per for k in p):  # a rank without a figure: left out
            xs = [p[k] for p in per if k in p]
            out[k] = {"mean": stats.mean(xs), "min": min(xs), "median": stats.median(xs),
                      "max": max(xs)}
        return out

    def metrics(self) -> dict[str, float]:
        """Headline figures (mean over ranks; steps_analysed: min) and _min/_median/_max."""
        out: dict[str, float] = {}
        for k, v in self.across_ranks().items():
            out[k] = v["min"] if k == "steps_analysed" else v["mean"]
        for k, v in self.across_ranks().items():
            for s in ("min", "median", "max"):
                out[f"{k}_{s}"] = v[s]
        if self.rank_set is not None:   # how many ranks, of how many: a partial set's caveat
            out.update(self.rank_set.metrics())
        return out

    def top_kernels(self, n: int | None = 30) -> list[tuple[KernelStat, float]]:
        """(stat, share %) summed over ranks; share = time / all ranks' step time."""
        acc: dict[tuple[str, str], list[float]] = {}
        for r in self.ranks:
            for k in r.kernels:
                a = acc.setdefault((k.name, k.category), [0, 0.0])
                a[0] += k.calls
                a[1] += k.total_us
        total_us = sum(r.total_step_ns for r in self.ranks) / 1e3
        rows = sorted(((KernelStat(nm, c, int(a[0]), a[1]), 100.0 * a[1] / total_us)
                       for (nm, c), a in acc.items()), key=lambda t: -t[0].total_us)
        return rows[:n] if n else rows

    def to_dict(self, top: int = 30) -> dict:
        """JSON-serialisable figures (what `k25exp analyze --json` prints)."""
        return {
            "metrics": self.metrics(),
            "categories": self.categories + [IDLE],
            "groups": self.rules.groups,
            "rules": self.rules.source,
            "max_steps": self.max_steps,
            "across_ranks": self.across_ranks(),
            "ranks": [_rank_dict(r, top) for r in self.ranks],
            "top_kernels": [_kernel_dict(k, s) for k, s in self.top_kernels(top)],
            "comm_split": ({"steps_matched": self.comm_split.steps_matched,
                            "reason": self.comm_split.reason} if self.comm_split else None),
            "rank_set": self.rank_set.to_dict() if self.rank_set else None,
            "warnings": self.all_warnings(),
            "notes": self.notes,
        }

    def all_warnings(self) -> list[str]:
        return self.warnings + [f"{r.label}: {w}" for r in self.ranks for w in r.warnings]


def _kernel_dict(k: KernelStat, share: float) -> dict:
    return {"name": k.name, "category": k.category, "calls": k.calls,
            "total_ms": k.total_us / 1e3, "mean_us": k.mean_us, "share": share}


def _rank_dict(r: RankBreakdown, top: int) -> dict:
    t = r.total_step_ns / 1e3
    return {
        "label": r.label, "rank": r.rank, "world_size": r.world_size, "path": r.path,
        "mode": r.mode,
        "step_source": r.step_source, "steps_analysed": r.steps_analysed,
        "annotated_steps": r.annotated_steps, "decode_steps": r.decode_steps,
        "decode_step_ms": r.decode_step_ms,
        "shares": r.shares(), "group_shares": r.group_shares(), "raw_shares": r.raw_shares(),
        "overlap_share": r.overlap_share, "busy_ms": r.busy_ms(),
        "metrics": r.metrics(),
        "comm_split": _split_dict(r),
        "steps_grown_over_trailing_collectives": r.steps_grown,
        "collectives": r.collectives,
        "device_events": r.device_events, "unrecognised_events": r.unrecognised,
        "gloo": (None if r.gloo_ext is None else
                 {"calls_extended": r.gloo_ext.paired, "spans_unclaimed": r.gloo_ext.unclaimed}),
        "top_kernels": [_kernel_dict(k, 100.0 * k.total_us / t) for k in r.kernels[:top]],
        "events_total": r.events_total, "events_kept": r.events_kept,
        "bytes_read": r.bytes_read, "read_s": r.read_s, "analyse_s": r.analyse_s,
        "warnings": r.warnings,
    }


def _split_dict(r: RankBreakdown) -> dict | None:
    """Per communication category: ms per step of wait, transport, raw; calls matched."""
    sp = r.comm_split
    if sp is None:
        return None
    n = max(1, sp.steps_matched.size) * 1e6  # per step the split covers
    by = {c: {"wait_ms_per_step": float(sp.wait_ns[:, i].sum()) / n,
              "transport_ms_per_step": float(sp.transport_ns[:, i].sum()) / n,
              "raw_ms_per_step": float(sp.raw_ns[:, i].sum()) / n,
              "calls_matched": int(sp.calls_matched[i])}
          for i, c in enumerate(r.categories) if sp.calls_matched[i]}
    return {"by_category": by, "calls_unmatched": sp.calls_unmatched,
            "calls_unsplittable": sp.calls_unsplittable}


def _attribute(cat_of: np.ndarray, s: np.ndarray, e: np.ndarray, n_cat: int, win: Windows
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Splits the windows at every category boundary; each elementary segment inside a
    window goes to the first busy category (priority order), or idle. Returns exclusive
    busy [steps, n_cat], raw busy [steps, n_cat] and work [steps]."""
    n_steps = win.s.size
    unions = [union(s[cat_of == c], e[cat_of == c]) for c in range(n_cat)]
    bounds = np.sort(np.concatenate([win.s, win.e] + [a for u in unions for a in u]))
    bounds = bounds[np.r_[True, bounds[1:] != bounds[:-1]]]
    left = bounds[:-1]
    length = np.diff(bounds).astype(np.float64)
    step = win.index(left)
    inside = step >= 0
    left, length, step = left[inside], length[inside], step[inside]
    covered = np.zeros((n_cat, left.size), dtype=bool)
    for c, (us, ue) in enumerate(unions):
        if us.size == 0:
            continue
        i = np.searchsorted(us, left, side="right") - 1
        ok = i >= 0
        covered[c] = ok & (ue[np.maximum(i, 0)] > left)
    busy_any = covered.any(axis=0)
    label = np.where(busy_any, covered.argmax(axis=0), n_cat)
    excl = np.bincount(step * (n_cat + 1) + label, weights=length,
                       minlength=n_steps * (n_cat + 1)).reshape(n_steps, n_cat + 1)
    raw = np.zeros((n_steps, n_cat))
    for c in range(n_cat):
        m = covered[c]
        if m.any():
            raw[:, c] = np.bincount(step[m], weights=length[m], minlength=n_steps)
    work = win.len.astype(np.float64) - excl[:, n_cat]
    return excl[:, :n_cat], raw, work


def analyze_trace(trace: Trace, rules: Rules, max_steps: int | None = None,
                  label: str = "rank0", rank: int | None = None,
                  min_batch: int | None = None) -> RankBreakdown:
    """The breakdown of one rank's trace (see the module docstring)."""
    t0 = time.perf_counter()
    device = trace.has_device_work()
    wanted = DEVICE_CATS if device else CPU_CATS
    codes = [i for i, c in enumerate(trace.cats) if c in wanted]
    mask = np.isin(trace.cat_id, codes)
    sel = select_steps(trace, device, mask, max_steps, min_batch)
    warnings = list(sel.warnings) + _unrecognised_warning(trace, device)
    steps = sel.steps

    idx = np.flatnonzero(mask)
    cat_index = {c: i for i, c in enumerate(rules.categories)}
    comm_idx = [cat_index[c] for c in communication_categories(rules.categories, rules.groups)]
    pairs = _categorise(trace, idx, rules, comm_idx, device)
    ev_pair, pair_cat = pairs.ev_pair, pairs.category
    start = trace.start_ns[idx]
    end = start + trace.dur_ns[idx]
    trailing = 0
    if device and sel.source != "window":
        trailing = _take_trailing_collectives(steps, start, end, np.isin(pair_cat[ev_pair], comm_idx))
    win = Windows(np.array([st.start_ns for st in steps], dtype=np.int64),
                  np.array([st.end_ns for st in steps], dtype=np.int64))
    if win.len.sum() <= 0:
        raise TraceError(trace.path, "nothing to analyse: the work events have no duration")
    gloo_ext = None
    if not device:  # a gloo collective's caller blocks until gloo's worker thread is done
        end, gloo_ext = gloo.extend_to_workers(start, end, trace.lane_id[idx], pair_cat[ev_pair],
                                               comm_idx, _gloo_spans(trace, rules, cat_index))
        if gloo_ext.unclaimed:
            warnings.append(f"{gloo_ext.unclaimed} gloo worker spans had no host collective "
                            "operator to pair with (left out)")
    comm = comm_calls(start, end, trace.lane_id[idx], pair_cat[ev_pair], comm_idx, win,
                      [st.name for st in steps], "gpu" if device else "cpu", trace.clock_offset_ns)
    if device:
        seg_s, seg_e, seg_pair = start, end, ev_pair
    else:
        seg_s, seg_e, seg_pair = self_time_segments(start, end, trace.lane_id[idx], ev_pair)
    # Only what can touch an analysed step.
    lo, hi = int(win.s.min()), int(win.e.max())
    near = (seg_e > lo) & (seg_s < hi)
    seg_s, seg_e, seg_pair = seg_s[near], seg_e[near], seg_pair[near]
    n_cat = len(rules.categories)
    excl, raw, work = _attribute(pair_cat[seg_pair], seg_s, seg_e, n_cat, win)

    # Per name: time inside steps and calls starting inside steps.
    t_in = win.overlap(seg_s, seg_e).astype(np.float64)
    total_ns = np.bincount(seg_pair, weights=t_in, minlength=pair_cat.size)
    calls = np.bincount(ev_pair[win.index(start) >= 0], minlength=pair_cat.size)
    order = np.argsort(-total_ns, kind="stable")
    kernels = [KernelStat(trace.names[int(pairs.name_id[i])],
                          rules.categories[int(pair_cat[i])], int(calls[i]), float(total_ns[i]) / 1e3)
               for i in order.tolist() if total_ns[i] > 0 or calls[i] > 0]

    step_ns = win.len.astype(np.float64)
    return RankBreakdown(
        label=label, path=str(trace.path), rank=rank, mode="gpu" if device else "cpu",
        step_source=sel.source, categories=list(rules.categories), groups=dict(rules.groups),
        steps=steps, step_ns=step_ns, busy_ns=excl, raw_busy_ns=raw, work_ns=work,
        kernels=kernels, annotated_steps=sel.annotated, decode_steps=sel.decode,
        events_total=trace.events_total, events_kept=trace.n_events, bytes_read=trace.bytes_read,
        read_s=trace.read_s, analyse_s=time.perf_counter() - t0, warnings=warnings, comm=comm,
        gloo_ext=gloo_ext, steps_grown=trailing, prefill_steps=sel.prefill_steps,
        prefill_ns=sel.prefill_ns, prefill_tokens=sel.prefill_tokens,
        collectives=pairs.attribution.counts() if device else None,
        device_events=_device_events(trace), unrecognised=dict(trace.unrecognised),
        phases=step_phases(trace.annotations, steps, sel.source),
    )


def _device_events(trace: Trace) -> dict[str, int]:
    counts = np.bincount(trace.cat_id, minlength=len(trace.cats))
    return {c: int(n) for c, n in zip(trace.cats, counts.tolist()) if c in DEVICE_CATS and n}


def _unrecognised_warning(trace: Trace, device: bool) -> list[str]:
    """Events of kinds the reader does not know are not counted: say how many and which,
    since device work among them would be missing (a trace of another accelerator would
    otherwise read as CPU-only, in silence)."""
    if not trace.unrecognised:
        return []
    n = sum(trace.unrecognised.values())
    return [f"{n} complete events of kinds the analyser does not recognise were not counted: "
            f"{unrecognised_text(trace.unrecognised)}; if they are device work, this breakdown "
            f"misses it (analysed as a {'device' if device else 'CPU'} trace)"]


@dataclass
class _Pairs:
    """The analysed events grouped by (name, trace category, category): each event's pair,
    and each pair's name id and category (a kernel name run by several collectives is a
    pair per collective)."""

    ev_pair: np.ndarray       # int32 per event
    name_id: np.ndarray       # per pair
    category: np.ndarray      # int16 per pair, into the rules' categories
    attribution: collectives.Attribution


def _categorise(trace: Trace, idx: np.ndarray, rules: Rules, comm_idx: list[int],
                device: bool) -> _Pairs:
    """Category of every analysed event: by its name (one rules lookup per distinct name
    and trace category), then collective kernels by what launched them (collectives)."""
    n_tc = len(trace.cats)
    pair = trace.name_id[idx].astype(np.int64) * n_tc + trace.cat_id[idx]
    upair, inv = np.unique(pair, return_inverse=True)
    inv = inv.reshape(-1)
    by_name = np.array([rules.categories.index(rules.classify(trace.names[p // n_tc],
                                                               trace.cats[p % n_tc]))
                        for p in upair.tolist()], dtype=np.int64).reshape(upair.size)
    attr = collectives.attribute(trace, idx, by_name[inv], comm_idx, rules, device)
    if np.array_equal(attr.category, by_name[inv]):
        return _Pairs(inv.astype(np.int32), upair // n_tc, by_name.astype(np.int16), attr)
    n_cat = len(rules.categories)
    upair, inv = np.unique(pair * n_cat + attr.category, return_inverse=True)
    return _Pairs(inv.reshape(-1).astype(np.int32), upair // n_cat // n_tc,
                  (upair % n_cat).astype(np.int16), attr)


def _take_trailing_collectives(steps: list[Step], start: np.ndarray, end: np.ndarray,
                               is_comm: np.ndarray) -> int:
    """Extends each device step window over the collective kernels that start after it ends
    and before the next annotated step begins (or, after the last one, within one step's
    length): a step's last collective on its own stream can start after the step's last
    compute kernel, where the device-side annotation of the compute stream ends; it was
    launched in that step and the step is not done until it is. Returns how many steps grew.
    (Without correlation ids a collective whose stream lags into the next step's window
    counts in that step.)"""
    order = np.argsort(start[is_comm], kind="stable")
    cs, ce = start[is_comm][order], end[is_comm][order]
    grown = 0
    for i, st in enumerate(steps):
        nxt = steps[i + 1].start_ns if i + 1 < len(steps) else None
        bounds = [x for x in (st.limit_ns, nxt) if x is not None]
        limit = min(bounds) if bounds else st.end_ns + st.dur_ns
        a, b = np.searchsorted(cs, st.end_ns, "left"), np.searchsorted(cs, limit, "left")
        if b > a:
            st.end_ns = int(min(limit, ce[a:b].max()))
            grown += 1
    return grown


def _gloo_spans(trace: Trace, rules: Rules, cat_index: dict[str, int]) -> gloo.WorkerSpans:
    spans = [(cat_index[rules.classify(a.name, a.cat)], a.start_ns, a.end_ns)
             for a in trace.annotations if a.name.startswith(gloo.PREFIX)]
    cols = np.array(spans, dtype=np.int64).reshape(-1, 3)
    return gloo.WorkerSpans(cols[:, 0], cols[:, 1], cols[:, 2])


def analyze(paths: Sequence[Path | str], rules_path: Path | str | None = None,
            max_steps: int | None = None, rules: Rules | None = None,
            chunk_bytes: int = DEFAULT_CHUNK_BYTES, min_batch: int | None = None) -> Analysis:
    """Analyses one trace per rank. Ranks come from the trace's distributedInfo, else from
    `rank<N>` in the file name, else from the order of `paths`. With ≥ 2 ranks, splits
    their collective calls into wait and transport (k25exp.traces.comm_split; the traces
    must come from one host); without, says why in `notes` (one rank) or `warnings`.
    Raises TraceError (naming the file) on unreadable input and RulesError on a bad rules
    file."""
    if not paths:
        raise ValueError("no trace files given")
    rules = rules if rules is not None else load_rules(rules_path)
    found: list[int | None] = []
    results: list[RankBreakdown] = []
    for p in paths:
        tr = read_trace(p, chunk_bytes=chunk_bytes, linked=collectives.linked(rules))
        rank = ranks.rank_of(tr)
        found.append(rank)
        results.append(analyze_trace(tr, rules, max_steps, rank=rank, min_batch=min_batch))
        results[-1].world_size = ranks.world_size_of(tr)
        del tr
    warnings: list[str] = []
    if all(r is not None for r in found) and len(set(found)) == len(found):
        for r, rk in zip(results, found):
            r.label = f"rank{rk}"
        results.sort(key=lambda r: r.rank)  # type: ignore[arg-type, return-value]
    else:
        if len(paths) > 1:
            warnings.append("ranks not recorded in the traces (distributedInfo) nor in the "
                            "file names: numbered in the order given")
        for i, r in enumerate(results):
            r.rank = i
            r.label = f"rank{i}"
    rank_set, rank_warnings = ranks.rank_set([r.label for r in results],
                                             [int(r.rank) for r in results],  # type: ignore[arg-type]
                                             [r.world_size for r in results])
    warnings += rank_warnings
    split = split_ranks([r.comm for r in results], [r.label for r in results],  # type: ignore[misc]
                        len(rules.categories))
    for r, rs in zip(results, split.ranks):
        r.comm_split = rs
    warnings += split.warnings
    notes: list[str] = []
    if split.reason:
        (warnings if len(results) > 1 else notes).append(split.reason)
    return Analysis(results, rules, max_steps, warnings, notes, split, rank_set)
