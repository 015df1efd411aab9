"""Interval arithmetic on integer-nanosecond numpy arrays: unions, clipping to windows, and
the self-time partition of nested operators.

Every function takes and returns parallel arrays of starts and ends (end >= start).
"""

from __future__ import annotations

import numpy as np


def union(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted, disjoint intervals covering exactly the union of the inputs (touching
    intervals are merged; empty ones dropped)."""
    keep = ends > starts
    s = starts[keep]
    e = ends[keep]
    if s.size == 0:
        return s.astype(np.int64), e.astype(np.int64)
    order = np.argsort(s, kind="stable")
    s = s[order]
    e = np.maximum.accumulate(e[order])
    new = np.empty(s.size, dtype=bool)
    new[0] = True
    new[1:] = s[1:] > e[:-1]
    first = np.flatnonzero(new)
    last = np.r_[first[1:] - 1, s.size - 1]
    return s[first], e[last]


def total(starts: np.ndarray, ends: np.ndarray) -> int:
    s, e = union(starts, ends)
    return int((e - s).sum())


class Windows:
    """Disjoint sorted windows (the analysed steps): which window holds a point, and how
    much of [s, e) lies inside any window."""

    def __init__(self, starts: np.ndarray, ends: np.ndarray):
        self.s = np.asarray(starts, dtype=np.int64)
        self.e = np.asarray(ends, dtype=np.int64)
        if self.s.size and np.any(self.s[1:] < self.e[:-1]):
            raise ValueError("windows overlap")
        self.len = self.e - self.s
        self.before = np.r_[0, np.cumsum(self.len)[:-1]] if self.s.size else self.len

    def index(self, x: np.ndarray) -> np.ndarray:
        """Window index holding each point (start <= x < end), or -1."""
        i = np.searchsorted(self.s, x, side="right") - 1
        ok = i >= 0
        ok[ok] = x[ok] < self.e[i[ok]]
        return np.where(ok, i, -1)

    def covered_before(self, x: np.ndarray) -> np.ndarray:
        """Total window length before x (piecewise linear, non-decreasing)."""
        i = np.searchsorted(self.s, x, side="right") - 1
        ic = np.maximum(i, 0)
        inside = np.clip(x - self.s[ic], 0, self.len[ic])
        return np.where(i >= 0, self.before[ic] + inside, 0)

    def overlap(self, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """Length of each [s, e) that lies inside the windows."""
        return self.covered_before(ends) - self.covered_before(starts)


def _self_segments_sweep(s: np.ndarray, e: np.ndarray, ids: np.ndarray
                         ) -> tuple[list[int], list[int], list[int]]:
    """General case (also operators that overlap without nesting): sweeps one lane's start
    and end points in time order; every instant belongs to the running operator that
    started last (at equal starts, the shorter one). With proper nesting that is the
    innermost operator, i.e. self time; in any case the lane's busy time is partitioned."""
    n = s.size
    # Points: ends before starts at the same time; among starts, longer first.
    t = np.concatenate([e, s])
    kind = np.r_[np.zeros(n, dtype=np.int8), np.ones(n, dtype=np.int8)]
    k = np.r_[np.arange(n), np.arange(n)]
    order = np.lexsort((np.r_[np.zeros(n), -(e - s)], kind, t))
    out_s: list[int] = []
    out_e: list[int] = []
    out_i: list[int] = []
    stack: list[int] = []
    alive = bytearray(n)
    idl = ids.tolist()
    prev = 0
    for tt, kk, op in zip(t[order].tolist(), kind[order].tolist(), k[order].tolist()):
        if stack and tt > prev:
            out_s.append(prev); out_e.append(tt); out_i.append(idl[stack[-1]])
        prev = tt
        if kk:
            stack.append(op)
            alive[op] = 1
        else:
            alive[op] = 0
            while stack and not alive[stack[-1]]:
                stack.pop()
    return out_s, out_e, out_i


def _self_segments_nested(s: np.ndarray, e: np.ndarray, ids: np.ndarray):
    """Vectorized self-time partition for one lane whose operators are properly nested
    (sorted by start, then longest first; positive durations). Returns None when they are
    not, so the caller can fall back to the sweep.

    In pre-order, an operator's first child (if any) is the next operator; the operator after
    its subtree is the first one starting at or after its end. Then operator i owns
    [s_i, first child's start or e_i), and its parent owns [e_i, next sibling's start or the
    parent's end).
    """
    n = s.size
    idx = np.arange(n, dtype=np.int32)
    depth = (idx - np.searchsorted(np.sort(e), s, side="right")).astype(np.int32)
    parent = np.full(n, -1, dtype=np.int32)
    max_depth = int(depth.max()) if n else 0
    if max_depth > 0:
        prev = np.flatnonzero(depth == 0).astype(np.int32)
        for d in range(1, max_depth + 1):
            cur = np.flatnonzero(depth == d).astype(np.int32)
            if cur.size == 0:
                break
            pos = np.searchsorted(prev, cur) - 1
            if np.any(pos < 0):
                return None
            parent[cur] = prev[pos]
            prev = cur
    del depth
    has_p = parent >= 0
    p = parent[has_p]
    if np.any(s[has_p] < s[p]) or np.any(e[has_p] > e[p]):
        return None
    roots = ~has_p
    if np.any(s[roots][1:] < e[roots][:-1]):  # top-level operators must not overlap
        return None
    # [s_i, first child's start or e_i) -> i
    first_child = np.zeros(n, dtype=bool)
    first_child[:-1] = parent[1:] == idx[:-1]
    a_end = e.copy()
    a_end[:-1][first_child[:-1]] = s[1:][first_child[:-1]]
    del first_child
    # [e_i, next sibling's start or the parent's end) -> parent
    after = np.minimum(np.searchsorted(s, e, side="left"), n - 1).astype(np.int32)
    sibling = (after > idx) & (parent[after] == parent) & has_p
    b_end = np.where(sibling, s[after], e[np.maximum(parent, 0)])[has_p]
    del after, sibling
    return (np.concatenate([s, e[has_p]]), np.concatenate([a_end, b_end]),
            np.concatenate([ids, ids[p]]))


def self_time_segments(starts: np.ndarray, ends: np.ndarray, lanes: np.ndarray,
                       ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Partitions each lane's busy time among its operators by self time: every instant
    belongs to the innermost operator running then, so nested operators are not counted
    twice (self time = duration minus the union of direct children). Returns segments
    (start, end, id of the owning operator); zero-length ones are dropped."""
    keep = ends > starts
    if not keep.all():
        starts, ends, lanes, ids = starts[keep], ends[keep], lanes[keep], ids[keep]
    order = np.lexsort((-ends, starts, lanes))
    s_all, e_all, l_all, i_all = starts[order], ends[order], lanes[order], ids[order]
    del order
    cuts = np.flatnonzero(l_all[1:] != l_all[:-1]) + 1
    bounds = [0, *cuts.tolist(), l_all.size]
    out_s, out_e, out_i = [], [], []
    for a, b in zip(bounds[:-1], bounds[1:]):
        s, e, i = s_all[a:b], e_all[a:b], i_all[a:b]
        got = _self_segments_nested(s, e, i)
        if got is None:
            ls, le, li = _self_segments_sweep(s, e, i)
            got = (np.asarray(ls, dtype=np.int64), np.asarray(le, dtype=np.int64),
                   np.asarray(li, dtype=i.dtype))
        pos = got[1] > got[0]
        out_s.append(got[0][pos]); out_e.append(got[1][pos]); out_i.append(got[2][pos])
        del got, pos
    if not out_s:
        z = np.zeros(0, dtype=np.int64)
        return z, z, z.astype(ids.dtype)
    if len(out_s) == 1:
        return out_s[0], out_e[0], out_i[0]
    return np.concatenate(out_s), np.concatenate(out_e), np.concatenate(out_i)
