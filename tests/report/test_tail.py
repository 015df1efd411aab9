"""The report's ITL tail section (k25exp.report.tail) on hand-built runs: the newest profile
run per level, its causes in the order the analyser names them, and the macro's levels from
the client's records alone."""

from __future__ import annotations

from k25exp.report.sources import Campaign, RunView
from k25exp.report.tail import TITLE, tail_section


def tail_metrics(prefill: float, long_step: float, n: int = 500) -> dict[str, float]:
    m = {"tail.itl_ms_p50": 20.0, "tail.itl_ms_p99": 60.0, "tail.itl_n": float(n),
         "tail.gaps": 5.0, "tail.excess_ms": 200.0, "tail.caused_pct": 97.5,
         "clock.error_ms": 2.5, "tail_client.agree_pct": 80.0}
    m.update({f"tail.cause.{c}_pct": 0.0 for c in ("skipped", "host_gap", "launch", "delivery")})
    m.update({"tail.cause.prefill_pct": prefill, "tail.cause.long_step_pct": long_step,
              "tail.cause.unexplained_pct": 100 - 97.5})
    return m


def run(i, phase, c, metrics, steps=None):
    return RunView(f"run{i:06d}", "0", phase, "FINISHED", start_time=i, metrics=metrics,
                   params={"experiment.concurrency": str(c), "experiment.load": "closed"},
                   steps=steps or {})


def test_the_newest_decomposition_at_each_profiled_level_and_the_macros_levels():
    old = run(1, "profile", 8, tail_metrics(10.0, 87.5))
    new = run(2, "profile", 8, tail_metrics(60.0, 37.5))
    c32 = run(3, "profile", 32, tail_metrics(90.0, 7.5, n=2000))
    before = run(0, "profile", 1, {"decode_step_ms": 10.0})  # a profile run without a tail
    hist = {"tail_client.itl_n": {8: 400.0}, "tail_client.itl_ms_p50": {8: 21.0},
            "tail_client.itl_ms_p99": {8: 70.0}, "tail_client.gaps": {8: 4.0},
            "tail_client.cause.engine_pct": {8: 50.0}, "tail_client.cause.prefill_pct": {8: 50.0},
            "tail_client.cause.skipped_pct": {8: 0.0}, "tail_client.cause.delivery_pct": {8: 0.0},
            "server_preemptions": {8: 0.0}, "server_itl_ms_p99_le": {8: 75.0}}
    macro = run(4, "macro", 0, {}, steps=hist)
    sec = tail_section(Campaign("x", "sqlite://", [old, new, c32, before, macro]))
    assert sec.title == TITLE
    prof, mac = sec.tables
    assert prof.columns[6:13] == ["prefill", "long_step", "skipped", "host_gap", "launch", "delivery",
                                  "unexplained"]
    assert [r[0] for r in prof.rows] == [8, 32] and prof.rows[0][-1] is new
    assert prof.rows[0][6:14] == [60.0, 37.5, 0.0, 0.0, 0.0, 0.0, 2.5, 97.5]
    assert prof.rows[1][3] == 2000 and prof.rows[1][-3:-1] == [2.5, 80.0]
    assert mac.columns[5:9] == ["prefill", "engine", "skipped", "delivery"]
    assert mac.rows == [[8, 21.0, 70.0, 400, 4, 50.0, 50.0, 0.0, 0.0, 0, 75.0, macro]]


def test_a_campaign_without_profile_runs_says_why():
    sec = tail_section(Campaign("x", "sqlite://", [run(4, "macro", 0, {})]))
    assert sec.tables == [] and "no finished `profile` run" in sec.notes[0]
