"""spec_decode's per-level comparison of the speculative run against its baseline, on
hand-logged figures: the levels are matched at the step both runs logged them at."""

from __future__ import annotations

import pytest

from k25exp.config.validate import to_typed
from k25exp.runners.spec_decode import _compare
from k25exp.tracking import MemoryRecorder
from k25exp.tracking.recorder import Capture
from tests.conftest import compose_cfg


def _runs(steps: dict[int, tuple[float, float]]):
    rec = MemoryRecorder()
    spec, base = Capture(rec), Capture(rec, "baseline/")
    spec.log_metrics({"single_stream_tpot_ms": 8.0})
    base.log_metrics({"single_stream_tpot_ms": 10.0})
    for step, (s, b) in steps.items():
        spec.log_metrics({"tpot_ms_p50": s, "valid": 1.0}, step=step)
        base.log_metrics({"tpot_ms_p50": b, "valid": 1.0}, step=step)
    return rec, spec, base


@pytest.mark.parametrize("load,levels,steps", [
    ("closed", ["experiment.concurrency=[1,4]"], {1: (8.0, 10.0), 4: (12.0, 18.0)}),
    # an open loop's levels are rates, logged at step = rate × 1000
    ("open", ["experiment.request_rate=[0.5,2]"], {500: (8.0, 10.0), 2000: (12.0, 18.0)}),
])
def test_levels_are_compared_at_the_step_both_runs_logged(tmp_path, load, levels, steps):
    exp = to_typed(compose_cfg("experiment=spec_decode", f"experiment.load={load}", *levels),
                   gpu_count=lambda: 0).experiment
    rec, spec, base = _runs(steps)
    summary = _compare(exp, spec, base, tmp_path, rec)
    assert summary == {"spec_speedup": 10.0 / 8.0}
    assert rec.latest("level_spec_speedup") == pytest.approx(
        {s: b / sp for s, (sp, b) in steps.items()})
    table = (tmp_path / "results.txt").read_text()
    assert ("rate/s" in table) == (load == "open") and ("conc" in table) == (load == "closed")
