"""The speculative step as profiled, joined to its baselines' profiles at the same level
(k25exp.report.spec_profiled), on hand-built runs; every figure worked out by hand."""

from __future__ import annotations

import pytest

from k25exp.report.figures import Section
from k25exp.report.sources import Campaign
from k25exp.report.spec_profiled import spec_profiled
from k25exp.tracking.read import RunView

SHAPE = {"experiment.input_tokens": "128", "experiment.output_tokens": "64",
         "model.name": "tiny_kimi", "server.tp": "2"}


def phases(prefix="", cycle=10.0, verify=8.0, sample=0.5, draft=0.0, gap=1.5, tpot=None):
    m = {f"{prefix}phase_{k}_ms": v for k, v in (("cycle", cycle), ("verify", verify), (
        "sample", sample), ("draft", draft), ("gap", gap), ("bookkeep", 0.0), ("other", 0.0))}
    if tpot is not None:
        m[f"{prefix}unprofiled_tpot_ms_mean"] = tpot
    return m


def run(i, phase, c, metrics, extra_args="['--disable-uvicorn-access-log']", status="FINISHED",
        **params):
    return RunView(f"run{i:06d}", "0", phase, status, start_time=i, metrics=metrics,
                   params={**SHAPE, "experiment.concurrency": str(c), "server.extra_args": extra_args,
                           **params})


SPEC = {"experiment.method": "ngram", "experiment.num_speculative_tokens": "3",
        "experiment.acceptance": "synthetic", "experiment.alphas": "[0.7]",
        "experiment.draft_model": "self"}


def test_a_sync_drafter_against_the_profiles_at_its_level():
    tau = 1 + 0.7 + 0.49 + 0.343  # E(0.7, 3) = 2.533
    spec = run(5, "spec_profile", 4, {**phases(cycle=17.0, verify=11.0, sample=1.0, draft=2.0,
                                                gap=3.0, tpot=7.0),
                                       "spec_expected_tokens_per_step": tau}, **SPEC)
    base = run(1, "profile", 4, phases(tpot=10.5))
    sync = run(2, "profile", 4, phases(cycle=12.0, gap=3.5, tpot=12.0),
               extra_args="['--disable-uvicorn-access-log', '--no-async-scheduling']")
    other_level = run(3, "profile", 8, phases(cycle=99.0))
    newer_elsewhere = run(4, "profile", 4, phases(cycle=50.0), **{"model.name": "other"})
    sec = Section("s")
    spec_profiled(Campaign("c", "uri", [spec, base, sync, other_level, newer_elsewhere]), sec)
    table, split = sec.tables
    (row,) = table.rows
    assert row[:5] == ["ngram", 3, 0.7, 4, pytest.approx(tau)]
    assert row[5:11] == [17.0, 11.0, 1.0, 2.0, None, 3.0]
    assert row[11:13] == [10.0, 12.0]                       # the c = 4 profiles of tiny_kimi
    assert row[13] == pytest.approx(10.0 * 2.533 / 17.0)   # profiled × = base × τ / spec
    assert row[14] == pytest.approx(10.5 / 7.0)            # unprofiled TPOTs
    assert row[15] == f"{spec.short} {base.short} {sync.short}"
    (parts,) = split.rows
    # by hand, against baseline_sync (ngram turns async scheduling off): scheduling 12 − 10,
    # verification 11 − 8, sampler 1 − 0.5, drafter 2, host 3 − 3.5; total 17 − 10
    assert parts[4:] == [pytest.approx(7.0), pytest.approx(2.0), pytest.approx(3.0),
                         pytest.approx(0.5), pytest.approx(2.0), pytest.approx(-0.5), "baseline_sync"]


def test_a_runs_own_baselines_win_and_an_async_drafter_needs_no_sync_one():
    own = {**phases(cycle=14.0, verify=11.0, sample=1.0, draft=1.0, gap=1.0),
           **phases("baseline/", cycle=9.0, verify=7.5, gap=1.0),
           "spec_expected_tokens_per_step": 2.0}
    spec = run(5, "spec_profile", 4, own, **{**SPEC, "experiment.method": "ngram_gpu"})
    elsewhere = run(1, "profile", 4, phases(cycle=30.0))
    sec = Section("s")
    spec_profiled(Campaign("c", "uri", [spec, elsewhere]), sec)
    table, split = sec.tables
    assert table.rows[0][11] == 9.0 and table.rows[0][12] is None
    # async kept: against the baseline; scheduling 0, verification 11 − 7.5, sampler 1 − 0.5,
    # drafter 1, host 1 − 1; total 14 − 9
    assert split.rows[0][4:] == [pytest.approx(5.0), 0.0, pytest.approx(3.5), pytest.approx(0.5),
                                 pytest.approx(1.0), pytest.approx(0.0), "baseline"]


def test_no_spec_profile_no_tables():
    sec = Section("s")
    spec_profiled(Campaign("c", "uri", [run(1, "profile", 4, phases())]), sec)
    assert sec.tables == []


def test_on_the_cpu_build_the_baseline_is_the_reference_for_any_drafter():
    # vLLM's CPU build runs every server without async scheduling: no baseline_sync needed
    spec = run(5, "spec_profile", 4, {**phases(cycle=33.9, verify=29.9, sample=0.5, draft=0.2, gap=3.3),
                                       "spec_expected_tokens_per_step": 2.533},
               **{**SPEC, "hardware.device": "cpu"})
    base = run(1, "profile", 4, phases(cycle=14.9, verify=12.0, sample=0.2, gap=2.7),
               **{"hardware.device": "cpu"})
    sec = Section("s")
    spec_profiled(Campaign("c", "uri", [spec, base]), sec)
    (parts,) = sec.tables[1].rows
    # by hand: 33.9 − 14.9 = 19.0 = scheduling 0 + verification 17.9 + sampler 0.3 + drafter
    # 0.2 + host 0.6
    assert parts[4:] == [pytest.approx(19.0), 0.0, pytest.approx(17.9), pytest.approx(0.3),
                         pytest.approx(0.2), pytest.approx(0.6), "baseline"]


def test_a_run_stopped_after_its_spec_capture_keeps_it_and_says_so():
    # a stage's time limit stopped the job while its baseline server started: the speculative
    # capture was logged, the baseline comes from the campaign's profile at the same level
    spec = run(5, "spec_profile", 4, {**phases(cycle=16.3, verify=9.3, sample=0.1, draft=1.3, gap=5.6),
                                       "spec_expected_tokens_per_step": 2.533},
               status="KILLED", **{**SPEC, "experiment.method": "eagle3"})
    half = run(6, "spec_profile", 4, {"spec_expected_tokens_per_step": 2.533}, status="KILLED",
               **SPEC)  # stopped before any capture: nothing to show
    base = run(1, "profile", 4, phases(cycle=5.0, verify=4.0, sample=0.1, gap=0.9))
    sec = Section("s")
    spec_profiled(Campaign("c", "uri", [spec, half, base]), sec)
    table, split = sec.tables
    (row,) = table.rows
    assert row[15] == f"{spec.short} (KILLED: stopped after its capture) {base.short}"
    # by hand, eagle3 keeps async scheduling: 16.3 − 5.0 = 11.3 = scheduling 0 + verification
    # 9.3 − 4.0 + sampler 0.1 − 0.1 + drafter 1.3 + host 5.6 − 0.9
    assert split.rows[0][4:] == [pytest.approx(11.3), 0.0, pytest.approx(5.3), pytest.approx(0.0),
                                 pytest.approx(1.3), pytest.approx(4.7), "baseline"]
