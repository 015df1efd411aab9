"""Interval unions, window clipping and the self-time partition (nested and not)."""

from __future__ import annotations

import numpy as np
import pytest

from k25exp.traces import intervals as iv


def a(*xs):
    return np.array(xs, dtype=np.int64)


def test_union_merges_overlapping_and_touching_drops_empty():
    s, e = iv.union(a(10, 0, 5, 30, 40, 50), a(20, 6, 12, 35, 40, 60))
    assert s.tolist() == [0, 30, 50] and e.tolist() == [20, 35, 60]
    assert iv.total(a(10, 0, 5, 30, 40, 50), a(20, 6, 12, 35, 40, 60)) == 35
    s, e = iv.union(a(), a())
    assert s.size == 0 and e.size == 0


def test_windows_index_and_overlap():
    w = iv.Windows(a(0, 100, 300), a(100, 200, 400))
    assert w.index(a(-1, 0, 99, 100, 250, 399, 400)).tolist() == [-1, 0, 0, 1, -1, 2, -1]
    # a kernel cut by step boundaries counts only its parts inside steps
    assert w.overlap(a(90, -50, 150, 250, 180), a(120, 10, 160, 260, 350)).tolist() == [30, 10, 10, 0, 70]
    with pytest.raises(ValueError):
        iv.Windows(a(0, 50), a(100, 150))


def _owned(seg):
    s, e, i = seg
    out: dict[int, int] = {}
    for x, y, k in zip(s.tolist(), e.tolist(), i.tolist()):
        out[k] = out.get(k, 0) + (y - x)
    return out


def test_self_time_of_nested_operators():
    # linear [10,60) > copy_ [12,20) and addmm [20,55) > inner [30,40); allreduce [60,90)
    s = a(10, 12, 20, 30, 60, 0)
    e = a(60, 20, 55, 40, 90, 0)   # last one: zero-length, owns nothing
    ids = a(0, 1, 2, 3, 4, 5)
    lanes = a(1, 1, 1, 1, 1, 1)
    got = _owned(iv.self_time_segments(s, e, lanes, ids))
    assert got == {0: 2 + 5, 1: 8, 2: 10 + 15, 3: 10, 4: 30}
    assert sum(got.values()) == iv.total(s, e)


def test_identical_intervals_and_equal_starts():
    # parent and child share their start; a duplicate of the child
    s = a(0, 0, 0, 50)
    e = a(100, 40, 40, 100)
    got = _owned(iv.self_time_segments(s, e, a(0, 0, 0, 0), a(0, 1, 2, 3)))
    assert sum(got.values()) == 100
    assert got[0] == 10 and got[3] == 50 and got.get(1, 0) + got.get(2, 0) == 40


def test_lanes_are_independent():
    s, e = a(0, 10, 0), a(100, 20, 50)
    got = _owned(iv.self_time_segments(s, e, a(1, 1, 2), a(0, 1, 2)))
    assert got == {0: 90, 1: 10, 2: 50}


def test_improper_nesting_falls_back_to_the_sweep():
    # B starts inside A and outlives it: every instant still owned once (latest start)
    s, e = a(0, 50, 120), a(100, 150, 130)
    assert iv._self_segments_nested(s, e, a(0, 1, 2)) is None
    got = _owned(iv.self_time_segments(s, e, a(0, 0, 0), a(0, 1, 2)))
    assert got == {0: 50, 1: 90, 2: 10}
    assert sum(got.values()) == iv.total(s, e)


def _random_tree(rng, n):
    """Properly nested intervals on one lane (a random call tree)."""
    out = []

    def fill(lo, hi, depth):
        t = lo
        while t < hi and len(out) < n:
            if rng.random() < 0.3:
                t += int(rng.integers(0, 5))
            d = int(rng.integers(1, max(2, (hi - t) // 2 + 1)))
            if t + d > hi:
                break
            out.append((t, t + d))
            if depth < 6 and d > 4:
                fill(t + int(rng.integers(0, 2)), t + d - int(rng.integers(0, 2)), depth + 1)
            t += d
    fill(0, 100_000, 0)
    return out


@pytest.mark.parametrize("seed", range(5))
def test_vectorized_self_time_matches_the_sweep(seed):
    rng = np.random.default_rng(seed)
    iv_ = _random_tree(rng, 3000)
    s = np.array([x for x, _ in iv_], dtype=np.int64)
    e = np.array([y for _, y in iv_], dtype=np.int64)
    perm = rng.permutation(s.size)
    s, e = s[perm], e[perm]
    ids = np.arange(s.size)
    keep = e > s
    o = np.lexsort((-e[keep], s[keep]))
    nested = iv._self_segments_nested(s[keep][o], e[keep][o], ids[keep][o])
    assert nested is not None
    sweep = iv._self_segments_sweep(s[keep][o], e[keep][o], ids[keep][o])
    sweep = tuple(np.asarray(x, dtype=np.int64) for x in sweep)
    pos = nested[1] > nested[0]
    assert _owned(tuple(x[pos] for x in nested)) == _owned(sweep)
    assert sum(_owned(sweep).values()) == iv.total(s, e)
