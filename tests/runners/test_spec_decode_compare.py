"""spec_decode's points from hand-logged rounds: medians, spreads and paired speedups worked
out by hand; the levels matched at the step every server logged them at."""

from __future__ import annotations

import csv

import pytest

from k25exp.config.validate import to_typed
from k25exp.runners.spec_decode_results import Measured, summarise
from k25exp.tracking import MemoryRecorder
from k25exp.tracking.recorder import Capture
from tests.conftest import compose_cfg


def _measured(server, alpha, rnd, rec, steps, tau=None, first=False, k=None, slot=0, extra=None):
    cap = Capture(rec if first else MemoryRecorder(), {"spec": "", "baseline": "baseline/",
                                                      "baseline_sync": "baseline_sync/"}[server]
                  if first else "")
    cap.log_metrics({"single_stream_tpot_ms": {"spec": 8.0, "baseline": 10.0}.get(server, 9.0)})
    for step, tpot in steps.items():
        m = {"tpot_ms_p50": tpot, "valid": 1.0}
        if tau is not None:
            m["mean_acceptance_length"] = tau
        m.update((extra or {}).get(step, {}))
        cap.log_metrics(m, step=step)
    return Measured(server, alpha, rnd, cap, k=k, slot=slot)


@pytest.mark.parametrize("load,levels,steps", [
    ("closed", ["experiment.concurrency=[1,4]"], (1, 4)),
    # an open loop's levels are rates, logged at step = rate × 1000
    ("open", ["experiment.request_rate=[0.5,2]"], (500, 2000)),
])
def test_points_over_rounds_by_hand(tmp_path, load, levels, steps):
    exp = to_typed(compose_cfg("experiment=spec_decode", f"experiment.load={load}", *levels),
                   gpu_count=lambda: 0).experiment
    lo, hi = steps
    rec = MemoryRecorder()
    # three rounds at α = 0.7: spec TPOT 5, 6, 4 ms at the low level (base 10, 11, 9);
    # 8, 9, 10 at the high one (base 12, 12, 15); tokens per step 2.5 everywhere
    spec = {1: {lo: 5.0, hi: 8.0}, 2: {lo: 6.0, hi: 9.0}, 3: {lo: 4.0, hi: 10.0}}
    base = {1: {lo: 10.0, hi: 12.0}, 2: {lo: 11.0, hi: 12.0}, 3: {lo: 9.0, hi: 15.0}}
    measured = [m for r in (1, 2, 3) for m in (
        _measured("spec", 0.7, r, rec, spec[r], tau=2.5, first=r == 1),
        _measured("baseline", None, r, rec, base[r], first=r == 1),
        _measured("baseline_sync", None, r, rec, {lo: 9.5, hi: 13.0}, first=r == 1))]
    summary = summarise(exp, measured, tmp_path, rec)
    assert summary == {"spec_speedup": 10.0 / 8.0}  # round 1's single stream
    # paired per round: 10/5, 11/6, 9/4 → median 2.0; 12/8, 12/9, 15/10 → median 1.5
    assert rec.latest("a0.7/speedup_med") == pytest.approx({lo: 2.0, hi: 1.5})
    assert rec.latest("a0.7/speedup_min") == pytest.approx({lo: 11 / 6, hi: 4 / 3})
    assert rec.latest("a0.7/speedup_max") == pytest.approx({lo: 2.25, hi: 1.5})
    assert rec.latest("a0.7/spec_tpot_ms_med") == {lo: 5.0, hi: 9.0}
    assert rec.latest("a0.7/base_tpot_ms_med") == {lo: 10.0, hi: 12.0}
    assert rec.latest("a0.7/sync_tpot_ms_med") == {lo: 9.5, hi: 13.0}
    assert rec.latest("a0.7/step_ms_med") == pytest.approx({lo: 12.5, hi: 22.5})  # 2.5 × TPOT
    assert rec.latest("a0.7/rounds") == {lo: 3.0, hi: 3.0}
    ci_lo, ci_hi = rec.latest("a0.7/speedup_ci_lo")[lo], rec.latest("a0.7/speedup_ci_hi")[lo]
    assert 11 / 6 <= ci_lo <= 2.0 <= ci_hi <= 2.25  # a bootstrap of the median within the data
    # round 1's per-level speedups keep their old names
    assert rec.latest("level_spec_speedup") == pytest.approx({lo: 2.0, hi: 1.5})
    rows = list(csv.DictReader(open(tmp_path / "points.csv")))
    assert len(rows) == 3 * 3 * 2  # servers × rounds × levels
    table = (tmp_path / "results.txt").read_text()
    assert ("rate/s" in table) == (load == "open") and ("conc" in table) == (load == "closed")


def test_draft_lengths_in_one_job_share_each_rounds_baseline(tmp_path):
    """experiment.draft_lengths=[1,3] (num_speculative_tokens 3): two speculative servers per
    round beside one baseline; each k's points are named k<k>/a<α>, its speedup paired with
    that round's baseline, worked out by hand."""
    cfg = compose_cfg("experiment=spec_decode", "experiment.concurrency=[1]",
                      "experiment.draft_lengths=[1,3]", "experiment.alphas=[0.7]")
    exp = to_typed(cfg, gpu_count=lambda: 0).experiment
    assert exp.k_values() == [3, 1]
    rec = MemoryRecorder()
    # round 1: base 10, k3 5, k1 8; round 2: base 12, k3 6, k1 8
    measured = [m for r, (b, s3, s1) in ((1, (10.0, 5.0, 8.0)), (2, (12.0, 6.0, 8.0))) for m in (
        _measured("spec", 0.7, r, rec, {1: s3}, tau=2.5, first=r == 1, k=3),
        _measured("spec", 0.7, r, rec, {1: s1}, tau=1.6, k=1),
        _measured("baseline", None, r, rec, {1: b}, first=r == 1))]
    summarise(exp, measured, tmp_path, rec)
    assert rec.latest("k3/a0.7/speedup_med") == pytest.approx({1: (10 / 5 + 12 / 6) / 2})  # 2.0
    assert rec.latest("k1/a0.7/speedup_med") == pytest.approx({1: (10 / 8 + 12 / 8) / 2})  # 1.375
    assert rec.latest("k1/a0.7/base_tpot_ms_med") == rec.latest("k3/a0.7/base_tpot_ms_med") == {1: 11.0}
    assert rec.latest("k1/a0.7/step_ms_med") == pytest.approx({1: 8.0 * 1.6})
    assert not [k for k, _, _ in rec.metrics if k.startswith("a0.7/")]   # no point without its k
    rows = list(csv.DictReader(open(tmp_path / "points.csv")))
    assert sorted((r["server"], r["k"], r["round"]) for r in rows) == [
        ("baseline", "", "1"), ("baseline", "", "2"), ("spec", "1", "1"), ("spec", "1", "2"),
        ("spec", "3", "1"), ("spec", "3", "2")]
    text = (tmp_path / "results.txt").read_text()
    assert "k = 3, 1" in text and "k1/a0.7" in text and "k3/a0.7" in text


def test_baseline_beside_pairs_each_spec_server_with_its_neighbours(tmp_path):
    """experiment.baseline_beside: B S3 B S1 B in a round, the machine slowing as it goes (the
    baseline 10, 12, 14 ms); each spec server's speedup is against the mean of the baselines
    just before and after it, worked out by hand. The order rules of the runner are checked
    on their own."""
    from k25exp.runners.spec_decode import rounds_order

    assert rounds_order(["spec_k3", "spec_k1", "baseline"], 2, baseline_first=False, beside=True) == [
        ["baseline", "spec_k3", "baseline", "spec_k1", "baseline"],
        ["baseline", "spec_k1", "baseline", "spec_k3", "baseline"]]
    cfg = compose_cfg("experiment=spec_decode", "experiment.concurrency=[1]",
                      "experiment.draft_lengths=[1,3]", "experiment.alphas=[0.7]",
                      "experiment.baseline_beside=true")
    exp = to_typed(cfg, gpu_count=lambda: 0).experiment
    rec = MemoryRecorder()
    measured = [_measured("baseline", None, 1, rec, {1: 10.0}, first=True, slot=0),
                _measured("spec", 0.7, 1, rec, {1: 5.5}, tau=2.5, first=True, k=3, slot=1),
                _measured("baseline", None, 1, rec, {1: 12.0}, slot=2),
                _measured("spec", 0.7, 1, rec, {1: 10.4}, tau=1.6, k=1, slot=3),
                _measured("baseline", None, 1, rec, {1: 14.0}, slot=4)]
    summarise(exp, measured, tmp_path, rec)
    # k3: (10 + 12) / 2 = 11 → 11 / 5.5 = 2.0; k1: (12 + 14) / 2 = 13 → 13 / 10.4 = 1.25
    assert rec.latest("k3/a0.7/base_tpot_ms_med") == pytest.approx({1: 11.0})
    assert rec.latest("k3/a0.7/speedup_med") == pytest.approx({1: 2.0})
    assert rec.latest("k1/a0.7/base_tpot_ms_med") == pytest.approx({1: 13.0})
    assert rec.latest("k1/a0.7/speedup_med") == pytest.approx({1: 1.25})
    rows = list(csv.DictReader(open(tmp_path / "points.csv")))
    assert [(r["server"], r["slot"]) for r in rows] == [("baseline", "0"), ("spec", "1"),
                                                       ("baseline", "2"), ("spec", "3"), ("baseline", "4")]
    with pytest.raises(Exception, match="experiment.baseline_beside=true needs experiment.baseline=true"):
        to_typed(compose_cfg("experiment=spec_decode", "experiment.baseline_beside=true",
                             "experiment.baseline=false"), gpu_count=lambda: 0)


@pytest.mark.parametrize("lengths,says", [
    ("[1,5]", "lacks experiment.num_speculative_tokens=3"),
    ("[3,3]", "expected distinct draft lengths >= 1"),
    ("[0,3]", "expected distinct draft lengths >= 1"),
])
def test_bad_draft_lengths_are_named(lengths, says):
    from k25exp.config.validate import ConfigError

    with pytest.raises(ConfigError, match=f"experiment.draft_lengths=.*{says}"):
        to_typed(compose_cfg("experiment=spec_decode", f"experiment.draft_lengths={lengths}"),
                 gpu_count=lambda: 0)


def test_a_round_on_a_shared_host_or_invalid_is_left_out_of_its_point(tmp_path):
    exp = to_typed(compose_cfg("experiment=spec_decode", "experiment.concurrency=[1,4]"),
                   gpu_count=lambda: 0).experiment
    rec = MemoryRecorder()
    # three rounds, spec TPOT 5 / 9 / 4 ms at c = 1 and c = 4 (base 10 / 11 / 9). Round 2's
    # speculative server shared its host at c = 1 (9 ms: slowed); at c = 4 its baseline was
    # invalid. At c = 4 rounds 1 and 3 shared theirs too, so no round is usable there.
    spec = {1: {1: 5.0, 4: 5.0}, 2: {1: 9.0, 4: 9.0}, 3: {1: 4.0, 4: 4.0}}
    base = {r: {1: b, 4: b} for r, b in ((1, 10.0), (2, 11.0), (3, 9.0))}
    shared = {1: {4: {"host_shared": 1.0}}, 2: {1: {"host_shared": 1.0}},
              3: {4: {"host_shared": 1.0}}}
    invalid = {2: {4: {"valid": 0.0}}}
    measured = [m for r in (1, 2, 3) for m in (
        _measured("spec", 0.7, r, rec, spec[r], tau=2.5, first=r == 1, extra=shared.get(r)),
        _measured("baseline", None, r, rec, base[r], first=r == 1, extra=invalid.get(r)))]
    summarise(exp, measured, tmp_path, rec)
    # c = 1 by hand from rounds 1 and 3: spec median (5 + 4) / 2 = 4.5; speedups 10/5 = 2
    # and 9/4 = 2.25, median 2.125; round 2 left out
    assert rec.latest("a0.7/spec_tpot_ms_med")[1] == 4.5
    assert rec.latest("a0.7/speedup_med")[1] == pytest.approx(2.125)
    assert (rec.latest("a0.7/rounds")[1], rec.latest("a0.7/rounds_left_out")[1],
            rec.latest("a0.7/host_shared")[1], rec.latest("a0.7/valid")[1]) == (2.0, 1.0, 0.0, 1.0)
    # c = 4: no round alone on its host, so the valid ones stay, on a shared host (rounds 1 and
    # 3: median (5 + 4) / 2 = 4.5 ms, speedups 2 and 2.25 → 2.125), round 2 (invalid) left
    # out, and the point says it was shared
    assert rec.latest("a0.7/spec_tpot_ms_med")[4] == 4.5
    assert rec.latest("a0.7/speedup_med")[4] == pytest.approx(2.125)
    assert (rec.latest("a0.7/rounds")[4], rec.latest("a0.7/rounds_left_out")[4],
            rec.latest("a0.7/host_shared")[4], rec.latest("a0.7/valid")[4]) == (2.0, 1.0, 1.0, 1.0)


def test_with_no_valid_round_every_round_stays_marked_invalid(tmp_path):
    exp = to_typed(compose_cfg("experiment=spec_decode", "experiment.concurrency=[1]"),
                   gpu_count=lambda: 0).experiment
    rec = MemoryRecorder()
    # both rounds' baselines invalid at c = 1: both stay (spec 5 and 4 ms → 4.5; 10/5 and 9/4)
    measured = [m for r, sp, b in ((1, 5.0, 10.0), (2, 4.0, 9.0)) for m in (
        _measured("spec", 0.7, r, rec, {1: sp}, tau=2.5, first=r == 1),
        _measured("baseline", None, r, rec, {1: b}, first=r == 1, extra={1: {"valid": 0.0}}))]
    summarise(exp, measured, tmp_path, rec)
    assert rec.latest("a0.7/spec_tpot_ms_med")[1] == 4.5
    assert (rec.latest("a0.7/rounds")[1], rec.latest("a0.7/rounds_left_out")[1],
            rec.latest("a0.7/valid")[1]) == (2.0, 0.0, 0.0)
