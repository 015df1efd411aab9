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


def _measured(server, alpha, rnd, rec, steps, tau=None, first=False):
    cap = Capture(rec if first else MemoryRecorder(), {"spec": "", "baseline": "baseline/",
                                                      "baseline_sync": "baseline_sync/"}[server]
                  if first else "")
    cap.log_metrics({"single_stream_tpot_ms": {"spec": 8.0, "baseline": 10.0}.get(server, 9.0)})
    for step, tpot in steps.items():
        m = {"tpot_ms_p50": tpot, "valid": 1.0}
        if tau is not None:
            m["mean_acceptance_length"] = tau
        cap.log_metrics(m, step=step)
    return Measured(server, alpha, rnd, cap)


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
