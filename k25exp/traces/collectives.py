"""Which collective a device kernel runs: by what launched it, not only by its name.

NCCL names a kernel by how it moves data, not always by the collective: in a 128-rank DLRM
job every NCCL kernel of a rank was `ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t`, launched
by all-to-alls, all-reduces and all-gathers alike. Every device kernel the rules put in a
communication category by its name is attributed, in order of trust, by

1. its own "Collective name" argument (newer torch writes it on NCCL kernels: "allreduce");
2. what launched it: the host runtime/driver call with the same `correlation` id, and the
   innermost host operator around that call that names a collective, by its own name
   (`nccl:all_reduce`, `c10d::alltoall_base_`) or, for `record_param_comms`, by its
   "Collective name" argument;
3. its name, when nothing above names a collective.

A "Collective name" value is classified by the rules as an event of category `collective`
(the default rules give comm_other to every value no other communication rule names). A
label whose category is not communication is passed over. Kernels whose names are not
communication are never attributed: a copy launched inside nccl:all_to_all stays a copy.
CPU operators with a "Collective name" (record_param_comms) take that collective's
category too, in CPU-only traces.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from k25exp.traces.comm_split import communication_categories
from k25exp.traces.reader import CPU_CATS, DEVICE_CATS, Trace
from k25exp.traces.rules import Rules

COLLECTIVE = "collective"   # the event category under which "Collective name" values are classified


@dataclass
class Attribution:
    category: np.ndarray   # per work event analysed: index into the rules' categories
    kernel_arg: int = 0    # collective kernels named by their own "Collective name"
    launcher: int = 0      # ... by what launched them
    name: int = 0          # ... by their name alone

    def counts(self) -> dict[str, int]:
        return {"kernel_arg": self.kernel_arg, "launcher": self.launcher, "name": self.name}


def attribute(trace: Trace, idx: np.ndarray, category: np.ndarray, comm: list[int],
              rules: Rules, device: bool) -> Attribution:
    """`idx`: the trace's work events analysed (ascending); `category`: the category each
    one's name gives; `comm`: the communication categories. Returns every event's category
    after attribution (see the module docstring), and how the collective kernels got theirs."""
    label_cat = _label_category(rules, set(comm))
    out = category.copy()
    if not device:   # operators (record_param_comms) that name their collective
        _by_own_label(trace, idx, out, label_cat, np.ones(idx.size, dtype=bool))
        return Attribution(out)
    candidate = np.isin(category, comm)
    named = _by_own_label(trace, idx, out, label_cat, candidate)
    todo = np.flatnonzero(candidate & ~named)
    by_launch = _by_launcher(trace, idx[todo], label_cat, rules, set(comm))
    hit = by_launch >= 0
    out[todo[hit]] = by_launch[hit]
    return Attribution(out, kernel_arg=int(named.sum()), launcher=int(hit.sum()),
                       name=int((~hit).sum()))


def linked(rules: Rules) -> Callable[[str], bool]:
    """Which device events the reader should keep the links of (read_trace's `linked`):
    the kernels the rules call communication by their names, the only ones attributed."""
    comm = set(communication_categories(rules.categories, rules.groups))
    return lambda name: rules.classify(name, DEVICE_CATS[0]) in comm


def _label_category(rules: Rules, comm: set[int]) -> Callable[[str], int]:
    """The communication category a "Collective name" value names, or -1."""
    index = {c: i for i, c in enumerate(rules.categories)}

    def category(label: str) -> int:
        c = index[rules.classify(label, COLLECTIVE)]
        return c if c in comm else -1
    return category


def _labelled(trace: Trace, among: np.ndarray, label_cat: Callable[[str], int]
              ) -> tuple[np.ndarray, np.ndarray]:
    """Positions in `among` (ascending event indexes) of the events whose "Collective name"
    names a communication category, and that category."""
    if not trace.coll or among.size == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    events = np.fromiter(trace.coll, dtype=np.int64, count=len(trace.coll))
    p = np.minimum(np.searchsorted(among, events), among.size - 1)
    cat = np.fromiter((label_cat(label) if ok else -1 for label, ok in
                       zip(trace.coll.values(), (among[p] == events).tolist())),
                      dtype=np.int64, count=events.size)
    keep = cat >= 0
    return p[keep], cat[keep]


def _by_own_label(trace: Trace, idx: np.ndarray, out: np.ndarray,
                  label_cat: Callable[[str], int], among: np.ndarray) -> np.ndarray:
    """Gives each analysed event of `among` (a mask) that names its collective ("Collective
    name") that collective's category, in place; returns the mask of those events."""
    named = np.zeros(idx.size, dtype=bool)
    p, cat = _labelled(trace, idx, label_cat)
    keep = among[p]
    p, cat = p[keep], cat[keep]
    out[p] = cat
    named[p] = True
    return named


def _by_launcher(trace: Trace, events: np.ndarray, label_cat: Callable[[str], int],
                 rules: Rules, comm: set[int]) -> np.ndarray:
    """Per device event: the communication category of the innermost host operator around
    its launch that names a collective, or -1 (no launch recorded, or no such operator)."""
    out = np.full(events.size, -1, dtype=np.int64)
    if events.size == 0 or trace.launches is None or trace.corr is None:
        return out
    li = trace.launches.find(trace.corr[events])
    has = np.flatnonzero(li >= 0)
    if has.size == 0:
        return out
    lanes, t = trace.launches.lane[li[has]], trace.launches.start_ns[li[has]]
    ops, op_cat = _collective_operators(trace, label_cat, rules, comm, np.unique(lanes))
    for lane in np.unique(lanes).tolist():
        q = np.flatnonzero(lanes == lane)
        mine = ops[trace.lane_id[ops] == lane]
        out[has[q]] = _innermost(trace.start_ns[mine], trace.start_ns[mine] + trace.dur_ns[mine],
                                 op_cat[np.searchsorted(ops, mine)], t[q])
    return out


def _collective_operators(trace: Trace, label_cat: Callable[[str], int], rules: Rules,
                          comm: set[int], lanes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The host operators on `lanes` that name a collective (ascending event indexes) and
    the communication category each names: by "Collective name" if it has one that does,
    else by its own name."""
    cpu = [i for i, c in enumerate(trace.cats) if c in CPU_CATS]
    ops = np.flatnonzero(np.isin(trace.cat_id, cpu) & np.isin(trace.lane_id, lanes))
    index = {c: i for i, c in enumerate(rules.categories)}
    names, inv = np.unique(trace.name_id[ops], return_inverse=True)
    by_name = np.array([index[rules.classify(trace.names[n], CPU_CATS[0])] for n in names.tolist()],
                       dtype=np.int64).reshape(names.size)
    cat = np.where(np.isin(by_name, list(comm)), by_name, -1)[inv.reshape(-1)]
    p, named = _labelled(trace, ops, label_cat)
    cat[p] = named
    keep = cat >= 0
    return ops[keep], cat[keep]


def _innermost(start: np.ndarray, end: np.ndarray, cat: np.ndarray, t: np.ndarray) -> np.ndarray:
    """For each instant of `t`: the category of the latest-started interval that holds it
    (the innermost, intervals of one thread being nested), or -1. Walks back from the last
    interval started by then over the ones that ended before it, all instants at once."""
    order = np.lexsort((-end, start))   # at equal starts the outer (longer) first
    s, e, c = start[order], end[order], cat[order]
    j = np.searchsorted(s, t, side="right") - 1
    active = np.flatnonzero(j >= 0)
    while active.size:
        ended = e[j[active]] <= t[active]
        j[active[ended]] -= 1
        active = active[ended & (j[active] >= 0)]
    return np.where(j >= 0, c[np.maximum(j, 0)], -1)
