"""gloo's collectives in CPU traces: the calling thread's operator only enqueues the work.

In PyTorch's gloo backend, `c10d::allreduce_` on the calling thread puts the collective on
gloo's work queue and returns (tens of µs). One of gloo's worker threads runs it, recorded as
a `gloo:all_reduce` user annotation on that thread whose span includes the wait for the
peers, while the caller blocks in `work.wait()`, which the profiler does not record. Read
alone, the caller's operator is a sliver and the time it spent blocked looks idle (vLLM's
CPU build takes this path where it has no shared-memory all-reduce: its AVX2 build).

`extend_to_workers` gives each outermost communication operator on a host thread the end of
the gloo worker span that ran it. Pairing, per category: the k-th operator with the first
unclaimed worker span that starts at or after it and before the category's next operator
(gloo runs a group's work in order, and a synchronous caller enqueues the next op only when
the last one is done). The operator then spans what its caller spent in the collective,
from arrival (its start) to completion (the worker's end): for the breakdown's self time
and for the wait/transport split alike. Spans no operator claims are counted, not used.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from k25exp.traces.comm_split import outermost

PREFIX = "gloo:"


@dataclass
class WorkerSpans:
    category: np.ndarray   # rules' category index per span
    start_ns: np.ndarray
    end_ns: np.ndarray


@dataclass
class Extension:
    paired: int = 0        # host operators given their worker span's end
    unclaimed: int = 0     # worker spans no operator claimed


def extend_to_workers(start: np.ndarray, end: np.ndarray, lane: np.ndarray,
                      category: np.ndarray, comm: Sequence[int], spans: WorkerSpans
                      ) -> tuple[np.ndarray, Extension]:
    """New ends for the events (start, end, lane, category per event) and what was paired.
    Only outermost operators of the `comm` categories change."""
    out = end.copy()
    ext = Extension(unclaimed=int(spans.start_ns.size))
    if spans.start_ns.size == 0:
        return out, ext
    is_comm = np.flatnonzero(np.isin(category, np.asarray(comm, dtype=category.dtype)))
    ops = is_comm[outermost(start[is_comm], end[is_comm], lane[is_comm])]
    for c in np.unique(spans.category).tolist():
        mine = ops[category[ops] == c]
        mine = mine[np.argsort(start[mine], kind="stable")]
        sel = np.flatnonzero(spans.category == c)
        sel = sel[np.argsort(spans.start_ns[sel], kind="stable")]
        s_start, s_end = spans.start_ns[sel], spans.end_ns[sel]
        j = 0
        for k, op in enumerate(mine.tolist()):
            j += int(np.searchsorted(s_start[j:], start[op], side="left"))
            if j >= s_start.size:
                break
            nxt = start[mine[k + 1]] if k + 1 < mine.size else None
            if nxt is not None and s_start[j] >= nxt:
                continue  # this op ran no gloo work (another backend): leave it as it is
            out[op] = max(int(out[op]), int(s_end[j]))
            ext.paired += 1
            ext.unclaimed -= 1
            j += 1
    return out, ext
