"""The TPOT model on hand-built inputs: every figure is written out here and each level's
parts, prediction and errors computed by hand in the comments beside the expectations."""

from __future__ import annotations

import copy

import pytest

from k25exp.report.tpot_model import (BETWEEN_STEPS, WAIT, Inputs, MicroParts, Profiled,
                                      predict_levels)


def profiles(**over) -> dict[int, Profiled]:
    """Two profiles, at c = 1 and c = 5 (so level 3 sits halfway between them)."""
    p1 = dict(parts={"attention": 2.0, "idle": 1.0, WAIT: 0.5, BETWEEN_STEPS: 0.3},
              profiler_overhead_ms=0.4, prefill_us_per_token=100.0, server_tpot_ms=10.0)
    p5 = dict(parts={"attention": 4.0, "idle": 2.0, WAIT: 1.0, BETWEEN_STEPS: 0.5},
              prefill_us_per_token=200.0)
    for k, fields in over.items():
        (p1 if k == "p1" else p5).update(fields)
    return {1: Profiled(**p1), 5: Profiled(**p5)}


def inputs(**over) -> Inputs:
    base = dict(
        tpot_ms={1: 5.0, 3: 8.0, 5: 12.0, 8: 20.0},
        micro={1: MicroParts(0.2, 1.0, 0.5),
               3: MicroParts(0.3, 1.5, 0.7, timing={"gemm": "isolated", "moe": "in-stream"}),
               5: MicroParts(0.4, 2.0, None, why={"moe": "gemm run x has no time at 5 tokens"}),
               8: MicroParts(0.5, 3.0, 1.2)},
        profiles=profiles(),
        prefill_tokens={1: 0.0, 3: 2.0, 5: 1.0, 8: 3.0},
        prefill_fit={3: (500.0, 10.0)})
    return Inputs(**{**base, **over})


def by_level(pred):
    return {lv.level: lv for lv in pred.levels}


def test_every_level_adds_its_parts():
    inp = inputs()
    before = copy.deepcopy(inp)
    pred = predict_levels(inp)
    lv = by_level(pred)
    assert list(lv) == [1, 3, 5, 8]
    # the profiler's overhead (0.4 ms, profile c=1) comes out of that profile's idle: 1.0 → 0.6
    assert pred.overhead_taken == {1: pytest.approx(0.4)}
    assert pred.in_server == {}

    # c = 1, a profiled level: micro 0.2 + 1.0 + 0.5 = 1.7; uncovered 2.0 + 0.6 + 0.5 + 0.3
    # = 3.4; no prefill (0 tokens) → 5.1 ms; error (5.1 − 5) / 5 = +2 %; against the
    # profile's server start (10 ms): (5.1 − 10) / 10 = −49 %
    one = lv[1]
    assert (one.comm_ms, one.burst_ms, one.gemm_ms, one.moe_ms) == (0.2, 0.2, 1.0, 0.5)
    assert one.uncovered_ms == pytest.approx(3.4)
    assert one.prefill_ms == 0.0
    assert one.predicted_ms == pytest.approx(5.1)
    assert one.error_pct == pytest.approx(2.0)
    assert one.error_vs_profile_server_pct == pytest.approx(-49.0)
    assert one.notes == ()

    # c = 3, halfway between the profiles: attention 3.0, idle (0.6 + 2.0) / 2 = 1.3, wait
    # 0.75, gap 0.4 → 5.45; micro 0.3 + 1.5 + 0.7 = 2.5; prefills: the level's own fit, 2
    # tokens × 500 µs = 1.0 ms → 8.95 ms; error 0.95 / 8 = +11.875 %; not profiled: no
    # error against a profile's server
    three = lv[3]
    assert three.uncovered_ms == pytest.approx(5.45)
    assert three.prefill_ms == pytest.approx(1.0)
    assert three.predicted_ms == pytest.approx(8.95)
    assert three.error_pct == pytest.approx(11.875)
    assert three.error_vs_profile_server_pct is None
    assert three.notes == (
        "no in-stream figure, timed gemm: isolated",
        "prefills shared: 2.0 prompt tokens per step × 500.00 µs (measured: the macro level's "
        "own requests, least squares over n = 10; the profiles' prefill steps: 150.00 µs)")

    # c = 5: no MoE figure, so no prediction (never 0 ms); its other parts still shown:
    # uncovered 4 + 2 + 1 + 0.5 = 7.5; prefills without a fit: 1 token × the profile's 200 µs
    five = lv[5]
    assert five.moe_ms is None and five.predicted_ms is None and five.error_pct is None
    assert five.uncovered_ms == pytest.approx(7.5)
    assert five.prefill_ms == pytest.approx(0.2)
    assert five.notes[0] == "moe: gemm run x has no time at 5 tokens"
    assert five.notes[1].startswith("prefills shared: 1.0 prompt tokens per step × 200.00 µs, "
                                    "the profiles' prefill steps")

    # c = 8, past the last profile: its parts held at c = 5 (7.5 ms), prefills 3 × 200 µs
    # = 0.6 ms; micro 0.5 + 3.0 + 1.2 = 4.7 → 12.8 ms; error (12.8 − 20) / 20 = −36 %
    eight = lv[8]
    assert eight.uncovered_ms == pytest.approx(7.5)
    assert eight.prefill_ms == pytest.approx(0.6)
    assert eight.predicted_ms == pytest.approx(12.8)
    assert eight.error_pct == pytest.approx(-36.0)
    assert eight.notes[0].endswith("which read high) (held at c=5)")
    assert eight.notes[1] == "uncovered parts held at c=5"

    assert inp == before  # a pure function: the inputs are left as they were


def test_the_in_server_burst_stands_for_the_collectives_on_a_cpu_communicator():
    # the burst in the server's workers: 0.1 ms at c=1, 0.5 ms at c=5 → 0.3 at c=3, held at 8
    inp = inputs(burst_is_transport=True,
                 profiles=profiles(p1={"server_burst_ms": 0.1}, p5={"server_burst_ms": 0.5}))
    pred = predict_levels(inp)
    lv = by_level(pred)
    assert pred.in_server == {1: 0.1, 5: 0.5}
    assert lv[3].comm_ms == pytest.approx(0.3)
    assert lv[3].burst_ms == 0.3  # the nccl_burst figure, beside it
    # 0.3 + 1.5 + 0.7 + 5.45 + 1.0, as without it: the two collectives' figures agree here
    assert lv[3].predicted_ms == pytest.approx(8.95)
    assert lv[3].notes[0] == "collectives: in-server burst"
    assert lv[8].comm_ms == 0.5
    assert lv[8].notes[0] == "collectives: in-server burst held at c=5"
    # 0.5 + 3.0 + 1.2 + 7.5 + 0.6
    assert lv[8].predicted_ms == pytest.approx(12.8)


def test_without_an_in_server_burst_the_nccl_burst_figure_is_used_and_said():
    lv = by_level(predict_levels(inputs(burst_is_transport=True)))
    assert lv[1].comm_ms == 0.2
    assert lv[1].notes == ("collectives: nccl_burst (no profile timed the burst in the "
                           "server's workers)",)


def test_a_part_a_needed_profile_lacks_leaves_the_level_unpredicted():
    # c=5 did not measure attention: levels 3, 5 and 8 need that profile, level 1 does not
    lv = by_level(predict_levels(inputs(profiles=profiles(
        p5={"parts": {"attention": None, "idle": 2.0, WAIT: 1.0, BETWEEN_STEPS: 0.5}}))))
    assert lv[1].predicted_ms == pytest.approx(5.1)
    for k in (3, 5, 8):
        assert lv[k].uncovered_ms is None and lv[k].predicted_ms is None
        assert "missing: attention (not in the profile(s) this level needs)" in lv[k].notes


def test_a_part_only_one_profile_measured_is_missing_where_the_other_is_needed():
    # the union of the profiles' parts: convolution only at c=1, so missing from c=5 on
    lv = by_level(predict_levels(inputs(profiles=profiles(
        p1={"parts": {"attention": 2.0, "convolution": 0.25, "idle": 1.0, WAIT: 0.5,
                      BETWEEN_STEPS: 0.3}}))))
    assert lv[1].uncovered_ms == pytest.approx(3.65)  # 3.4 + 0.25
    assert "missing: convolution (not in the profile(s) this level needs)" in lv[3].notes


def test_a_missing_micro_part_says_why_or_that_it_is_out_of_range():
    inp = inputs(micro={**inputs().micro, 1: MicroParts(None, 1.0, 0.5),
                        3: MicroParts(None, 1.5, 0.7, why={"comm": "no nccl_burst run"})})
    lv = by_level(predict_levels(inp))
    assert lv[1].predicted_ms is None
    assert lv[1].notes == ("comm: outside the measured range",)
    assert lv[3].notes[0] == "comm: no nccl_burst run"


def test_prefills_shared_missing_negative_fit_and_no_profile():
    # no prefill_tokens_per_decode_step at c=1 (a run older than it): no prediction there
    # a negative slope at c=3 counts 0 ms: 2.5 + 5.45 + 0 = 7.95
    lv = by_level(predict_levels(inputs(prefill_tokens={3: 2.0, 5: 1.0, 8: 3.0},
                                        prefill_fit={3: (-40.0, 4.0)})))
    assert lv[1].prefill_ms is None and lv[1].predicted_ms is None
    assert lv[1].notes[-1].startswith("missing: prefills shared (the macro run has no "
                                      "prefill_tokens_per_decode_step")
    assert lv[3].prefill_ms == 0.0
    assert lv[3].predicted_ms == pytest.approx(7.95)
    assert "0 µs (fit -40.00 µs: no cost above the noise; measured" in lv[3].notes[-1]
    # no fit and no profile that timed a prefill step: missing
    bare = by_level(predict_levels(inputs(profiles=profiles(p1={"prefill_us_per_token": None},
                                                            p5={"prefill_us_per_token": None}))))
    assert bare[5].prefill_ms is None
    assert bare[5].notes[-1] == ("missing: prefills shared (no profile of this campaign "
                                 "timed a prefill step)")


def test_the_profilers_overhead_takes_idle_to_zero_at_most():
    # 3 ms of overhead against 1 ms of idle at c=1: 1 ms taken, idle 0 → 2 + 0 + 0.5 + 0.3
    pred = predict_levels(inputs(profiles=profiles(p1={"profiler_overhead_ms": 3.0},
                                                   p5={"profiler_overhead_ms": -1.0})))
    assert pred.overhead_taken == {1: 1.0}  # a negative overhead takes nothing
    assert by_level(pred)[1].uncovered_ms == pytest.approx(2.8)


def test_a_level_without_micro_parts_is_refused_by_name():
    with pytest.raises(ValueError, match=r"micro: no parts for macro level\(s\) \[8\]"):
        predict_levels(inputs(micro={k: v for k, v in inputs().micro.items() if k != 8}))
