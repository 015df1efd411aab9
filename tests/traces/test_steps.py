"""vLLM step annotations: formats, pure-decode selection, device vs host windows."""

from __future__ import annotations

import numpy as np
import pytest

from k25exp.traces.reader import read_trace
from k25exp.traces.steps import parse_step_name, select_steps
from tests.traces.builders import DECODE, PREFILL, ev, step, write_trace


@pytest.mark.parametrize("name, fmt, ctx, gen, decode", [
    ("execute_context_0(0)_generation_1(1)", "context_generation", 0, 1, True),
    ("execute_context_0(0)_generation_128(128)", "context_generation", 0, 128, True),
    ("execute_context_1(512)_generation_0(0)", "context_generation", 1, 0, False),
    ("execute_context_1(64)_generation_7(7)", "context_generation", 1, 7, False),
    ("execute_context_0(0)_generation_0(0)", "context_generation", 0, 0, False),
    ("execute_4_context_0(sq0sk0sqsq0sqsk0)_generation_4(sq4sk812sqsq4sqsk812)", "detailed", 0, 4, True),
    ("execute_520_context_1(sq512sk512sqsq262144sqsk262144)_generation_8(sq8sk900sqsq8sqsk900)",
     "detailed", 1, 8, False),
    ("execute_new_0_cached_3", "new_cached", 0, 3, True),
    ("execute_new_2_cached_3", "new_cached", 2, 3, False),
])
def test_parse_step_name(name, fmt, ctx, gen, decode):
    info = parse_step_name(name)
    assert info is not None
    assert (info.format, info.context_requests, info.generation_requests, info.pure_decode) == (
        fmt, ctx, gen, decode)


@pytest.mark.parametrize("name", ["ProfilerStep#3", "execute_model", "execute_context_0(0)",
                                  "gloo:all_reduce", "execute_context_0(0)_generation_1(1)x"])
def test_not_a_step(name):
    assert parse_step_name(name) is None


def _select(tmp_path, events, device=True, max_steps=None, min_batch=None):
    t = read_trace(write_trace(tmp_path / "t.json", events))
    work = np.isin(t.cat_id, [0, 1, 2]) if device else t.cat_id == 3
    return t, select_steps(t, device, work, max_steps, min_batch)


def test_device_annotations_preferred_and_merged_per_step(tmp_path):
    # host windows [0,10) [20,30) [40,50); the device runs later, once per stream
    ev_ = [ev("k", 0, 100)]
    for i, (h, d) in enumerate([(0, 5), (20, 25), (40, 45)]):
        ev_.append(step(DECODE, h, 10, ext=10 + i))
        ev_.append(step(DECODE, d, 12, device=True, tid=7, ext=10 + i))
        ev_.append(step(DECODE, d + 2, 13, device=True, tid=8, ext=10 + i))
    t, sel = _select(tmp_path, ev_)
    assert sel.source == "gpu_user_annotation"
    assert [(s.start_ns, s.end_ns) for s in sel.steps] == [(5000, 20000), (25000, 40000), (45000, 60000)]
    assert sel.annotated == 3 and sel.decode == 3 and not sel.warnings


def test_device_copies_without_external_ids_merge_by_overlap(tmp_path):
    ev_ = [ev("k", 0, 100)]
    for d in (5, 25):
        ev_.append(step(DECODE, d, 12, device=True, tid=7))
        ev_.append(step(DECODE, d + 2, 13, device=True, tid=8))
    _, sel = _select(tmp_path, ev_)
    assert [(s.start_ns, s.end_ns) for s in sel.steps] == [(5000, 20000), (25000, 40000)]


def test_host_windows_when_no_device_annotations(tmp_path):
    _, sel = _select(tmp_path, [ev("k", 0, 100), step(DECODE, 0, 10), step(DECODE, 10, 10)])
    assert sel.source == "user_annotation"
    assert "host-side" in sel.warnings[0]
    assert len(sel.steps) == 2


def test_only_pure_decode_steps_and_max_steps(tmp_path):
    ev_ = [ev("k", 0, 1000), step(PREFILL, 0, 50)]
    ev_ += [step(DECODE, 50 + 10 * i, 10) for i in range(6)]
    ev_ += [step("execute_context_1(4)_generation_2(2)", 120, 10)]
    _, sel = _select(tmp_path, ev_, device=False, max_steps=None)
    assert sel.annotated == 8 and sel.decode == 6 and len(sel.steps) == 6
    assert sel.steps[0].start_ns == 50_000
    _, sel = _select(tmp_path, ev_, device=False, max_steps=4)
    assert len(sel.steps) == 4 and sel.decode == 6


def test_overlapping_steps_are_cut(tmp_path):
    _, sel = _select(tmp_path, [ev("k", 0, 100), step(DECODE, 0, 12, device=True, ext=1),
                                step(DECODE, 10, 10, device=True, ext=2)])
    assert [(s.start_ns, s.end_ns) for s in sel.steps] == [(0, 10000), (10000, 20000)]
    assert any("overlapped" in w for w in sel.warnings)


def test_no_annotations_gives_the_whole_window(tmp_path):
    _, sel = _select(tmp_path, [ev("a", 10, 5), ev("b", 40, 30, tid=8)])
    assert sel.source == "window" and len(sel.steps) == 1
    assert (sel.steps[0].start_ns, sel.steps[0].end_ns) == (0, 60_000)
    assert "no vLLM step annotations" in sel.warnings[0]


def test_only_prefill_steps_gives_the_whole_window(tmp_path):
    _, sel = _select(tmp_path, [ev("a", 0, 5), step(PREFILL, 0, 50, device=True)])
    assert sel.source == "window" and sel.annotated == 1 and sel.decode == 0
    assert "none is a pure decode step" in sel.warnings[0]


def test_host_time_between_consecutive_steps():
    from k25exp.traces.steps import Step, between_steps_ns

    # steps of 100 ns with gaps 10, 20, a 500 (a prefill or a pause: longer than the median
    # step, left out) and a negative one (overlap: left out)
    steps = [Step("a", 0, 100), Step("b", 110, 210), Step("c", 230, 330), Step("d", 830, 930),
             Step("e", 920, 1020)]
    assert between_steps_ns(steps) == [10, 20]
    assert between_steps_ns(steps[:1]) == []


def test_a_levels_batch_leaves_out_its_ramp_up_and_drain(tmp_path):
    """Two steps of 2 requests (the ramp-up), three of 32, one of 30 (drain within 10 %), one
    of 8 (the drain): with min_batch 29 the four steps of ≥ 29 requests stay, the three
    others are counted in a warning; a batch no step reached leaves every step in."""
    gens = [2, 2, 32, 32, 32, 30, 8]
    ev_ = [ev("k", 0, 1000)] + [step(f"execute_context_0(0)_generation_{g}({g})", 10 * i, 10)
                                 for i, g in enumerate(gens)]
    _, sel = _select(tmp_path, ev_, device=False, max_steps=None, min_batch=29)
    assert [s.start_ns for s in sel.steps] == [20_000, 30_000, 40_000, 50_000]
    assert sel.decode == 7 and any("3 of 7 decode steps ran fewer than 29" in w for w in sel.warnings)
    _, sel = _select(tmp_path, ev_, device=False, max_steps=None, min_batch=64)
    assert len(sel.steps) == 7 and any("no decode step ran ≥ 64" in w for w in sel.warnings)
    _, sel = _select(tmp_path, ev_, device=False, max_steps=None)
    assert len(sel.steps) == 7 and not any("decode step" in w for w in sel.warnings)
