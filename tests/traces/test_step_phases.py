"""The step's cycle split by vLLM's scopes (k25exp.traces.step_phases), on hand-built
annotations whose phases are counted by hand (units: 1 = 1 ms)."""

import pytest

from k25exp.traces.reader import Annotation
from k25exp.traces.step_phases import step_phases
from k25exp.traces.steps import Step

MS = 1_000_000


def ann(name, s, e, cat="user_annotation"):
    return Annotation(name, cat, s * MS, e * MS, lane=0)


def step(s, e, limit):
    return Step("execute_context_0(0)_generation_2(8)", s * MS, e * MS, None if limit is None else limit * MS)


def scope(part, s, e, cat="user_annotation"):
    return ann(f"gpu_model_runner: {part}", s, e, cat)


def test_host_cycles_split_into_phases_that_sum_to_the_cycle():
    steps = [step(0, 10, 20), step(20, 28, 40), step(40, 50, 200), step(200, 210, None)]
    anns = [scope("forward", 1, 9), scope("forward", 21, 27),   # inside the steps: verify
            scope("sample", 10, 12), scope("draft", 12, 17), scope("bookkeep", 16, 18),
            scope("sample", 28, 30), scope("draft", 30, 36), scope("ModelRunnerOutput", 36, 37),
            scope("sample", 50, 52)]
    ph = step_phases(anns, steps, "user_annotation")
    # cycle 1: verify 8 (the forward), other 2 (the step's [0, 1] and [9, 10]), sample 2,
    #   draft 5, bookkeep 1 (its first ms is the draft's), gap 2
    # cycle 2: verify 6, other 2 + 1 (the step outside its forward; ModelRunnerOutput), sample 2,
    #   draft 6, gap 3
    # cycle 3 (160 ms > 4 × median 20) dropped; the last step has no next step: no cycle
    assert (ph.timeline, ph.cycles, ph.dropped) == ("host", 2, 1)
    assert ph.ms == pytest.approx({"verify": 7.0, "sample": 2.0, "draft": 5.5, "bookkeep": 0.5,
                                   "other": 2.5, "gap": 2.5, "cycle": 20.0})
    assert sum(v for k, v in ph.ms.items() if k != "cycle") == pytest.approx(ph.ms["cycle"])
    assert ph.host_ms == {}
    assert ph.metrics()["phase_draft_ms"] == pytest.approx(5.5)


def test_without_a_forward_scope_the_whole_step_is_verify():
    steps = [step(0, 10, 20), step(20, 28, None)]
    ph = step_phases([scope("preprocess", 0, 2), scope("sample", 10, 12)], steps, "user_annotation")
    # by hand: verify 10 (the step; its preprocess is inside it), sample 2, gap 8
    assert ph.ms == pytest.approx({"verify": 10.0, "sample": 2.0, "draft": 0.0, "bookkeep": 0.0,
                                   "other": 0.0, "gap": 8.0, "cycle": 20.0})


def test_device_timeline_puts_a_host_drafter_in_the_gap_and_gives_its_host_time():
    dev = "gpu_user_annotation"
    steps = [step(0, 6, 10), step(10, 16, 20), step(20, 26, None)]
    anns = [scope("sample", 6, 7, dev), scope("sample", 16, 17, dev),
            # the n-gram drafter runs on the host: no device copy of its scope
            scope("draft", 5, 8), scope("draft", 14, 18)]
    ph = step_phases(anns, steps, dev)
    assert (ph.timeline, ph.cycles) == ("device", 2)
    assert ph.ms == pytest.approx({"verify": 6.0, "sample": 1.0, "draft": 0.0, "bookkeep": 0.0,
                                   "other": 0.0, "gap": 3.0, "cycle": 10.0})
    assert ph.host_ms == pytest.approx({"draft": 3.5})   # (3 + 4) / 2


def test_no_scopes_no_phases():
    steps = [step(0, 6, 10), step(10, 16, None)]
    assert step_phases([ann("execute_context_0(0)_generation_2(8)", 0, 6)], steps,
                       "user_annotation") is None


def phases(cycle, verify, sample, draft, gap, bookkeep=0.0, other=0.0):
    return {"phase_cycle_ms": cycle, "phase_verify_ms": verify, "phase_sample_ms": sample,
            "phase_draft_ms": draft, "phase_gap_ms": gap, "phase_bookkeep_ms": bookkeep,
            "phase_other_ms": other}


def test_gap_split_of_a_sync_drafter_against_the_sync_baseline():
    from k25exp.traces.step_phases import gap_split

    base = phases(10.0, 8.0, 0.5, 0.0, 1.5)            # async baseline
    sync = phases(12.0, 8.0, 0.5, 0.0, 3.0, 0.5)       # its scheduling, async off
    spec = phases(17.0, 11.0, 1.0, 2.0, 2.5, 0.5)
    got = gap_split(spec, base, sync, async_kept=False)
    # by hand: scheduling 12 − 10; verification 11 − 8; sampler 1 − 0.5; drafter 2;
    # host (2.5 + 0.5) − (3 + 0.5) = −0.5; total 17 − 10 = 7 = 2 + 3 + 0.5 + 2 − 0.5
    assert got == pytest.approx({"scheduling": 2.0, "verification": 3.0, "sampler": 0.5,
                                 "drafter": 2.0, "host": -0.5, "total": 7.0})
    kept = gap_split(spec, base, sync, async_kept=True)   # against the async baseline
    assert kept["scheduling"] == 0.0 and kept["host"] == pytest.approx(1.5)
    with pytest.raises(KeyError, match="baseline_sync"):
        gap_split(spec, base, None, async_kept=False)
