"""The measured points the report reads back from spec_decode runs (k25exp.report.spec_sweep),
on hand-built runs: a job of one draft length names its points a<α>/…, a job of several
(experiment.draft_lengths) k<k>/a<α>/…, and each point keeps its own k."""

from __future__ import annotations

from k25exp.report.sources import Campaign
from k25exp.report.spec_sweep import _settings, points_of
from k25exp.tracking.read import RunView

PARAMS = {"experiment.method": "ngram", "experiment.num_speculative_tokens": "3",
          "experiment.acceptance": "synthetic", "experiment.alphas": "[0.7]",
          "experiment.input_tokens": "128", "experiment.output_tokens": "64",
          "model.name": "tiny_kimi", "server.tp": "2", "experiment.draft_model": "self"}


def point(prefix: str, c: int, spec: float, base: float, tau: float) -> dict[str, dict[int, float]]:
    figs = {"spec_tpot_ms_med": spec, "base_tpot_ms_med": base, "sync_tpot_ms_med": base + 1,
            "tokens_per_step_med": tau, "speedup_med": base / spec, "speedup_ci_lo": base / spec - 0.1,
            "speedup_ci_hi": base / spec + 0.1, "rounds": 3.0}
    return {f"{prefix}/{k}": {c: v} for k, v in figs.items()}


def run(i: int, steps: dict, **params) -> RunView:
    return RunView(f"run{i:06d}", "0", "spec_decode", "FINISHED", start_time=i,
                   params={**PARAMS, **params}, steps=steps,
                   metrics={k: next(iter(v.values())) for k, v in steps.items()})


def test_a_job_of_several_draft_lengths_gives_each_point_its_k():
    several = run(1, {**point("k3/a0.7", 4, 5.0, 10.0, 2.5), **point("k1/a0.7", 4, 8.0, 10.0, 1.6)},
                  **{"experiment.draft_lengths": "[1, 3]"})
    got = sorted((p.k, p.alpha, p.c, p.spec_ms, p.base_ms, p.tau, p.rounds) for p in points_of([several]))
    assert got == [(1, 0.7, 4, 8.0, 10.0, 1.6, 3), (3, 0.7, 4, 5.0, 10.0, 2.5, 3)]
    one = run(2, point("a0.7", 4, 6.0, 10.0, 2.4), **{"experiment.num_speculative_tokens": "5"})
    (p,) = points_of([one])
    assert (p.k, p.alpha, p.spec_ms) == (5, 0.7, 6.0)  # k from the job's num_speculative_tokens
    # one setting: a job of one k logs draft_lengths [] and pools with a run from before the
    # key existed (no param); a job of several k at the same num_speculative_tokens does not
    k3 = {"experiment.num_speculative_tokens": "3"}
    new = run(3, point("a0.7", 4, 6.0, 10.0, 2.4), **k3, **{"experiment.draft_lengths": "[]"})
    old = run(4, point("a0.7", 4, 6.2, 10.0, 2.4), **k3)
    groups = _settings(Campaign("c", "uri", [several, new, old]))
    assert sorted(sorted(r.run_id for r in g) for g in groups) == [
        [several.run_id], sorted([new.run_id, old.run_id])]


def levels(*parts: dict) -> dict[str, dict[int, float]]:
    """Several levels' points of one run merged into one steps dict."""
    out: dict[str, dict[int, float]] = {}
    for part in parts:
        for key, by_c in part.items():
            out.setdefault(key, {}).update(by_c)
    return out


def with_valid(prefix: str, c: int, ok: bool) -> dict[str, dict[int, float]]:
    return {f"{prefix}/valid": {c: 1.0 if ok else 0.0}}


def test_a_run_that_marked_a_point_invalid_is_left_out_of_it():
    # three runs of one setting: the second's c = 4 lagged (spec 9 ms: its median would move);
    # at c = 16 every run was marked invalid; c = 1 comes from a run from before `valid`
    runs = [run(1, levels(point("a0.7", 4, 5.0, 10.0, 2.5), with_valid("a0.7", 4, True),
                          point("a0.7", 16, 7.0, 12.0, 2.4), with_valid("a0.7", 16, False))),
            run(2, levels(point("a0.7", 4, 9.0, 10.0, 2.5), with_valid("a0.7", 4, False),
                          point("a0.7", 16, 8.0, 12.0, 2.4), with_valid("a0.7", 16, False))),
            run(3, levels(point("a0.7", 4, 6.0, 10.0, 2.5), with_valid("a0.7", 4, True),
                          point("a0.7", 16, 9.0, 12.0, 2.4), with_valid("a0.7", 16, False),
                          point("a0.7", 1, 4.0, 6.0, 2.0)))]
    got = {p.c: p for p in points_of(runs)}
    c4 = got[4]
    # by hand: the medians of runs 1 and 3 (5 and 6 ms; 10/5 = 2 and 10/6 = 1.667), their rounds
    assert (c4.spec_ms, round(c4.speedup, 4), c4.rounds, c4.left_out, c4.valid) == (
        5.5, 1.8333, 6, 1, True)
    assert {r.run_id for r in c4.run} == {runs[0].run_id, runs[2].run_id}
    c16 = got[16]   # no valid run: all kept, marked
    assert (c16.spec_ms, c16.rounds, c16.left_out, c16.valid) == (8.0, 9, 0, False)
    c1 = got[1]     # no `valid` logged: counts as valid
    assert (c1.spec_ms, c1.left_out, c1.valid) == (4.0, 0, True)


def test_the_section_never_fits_or_projects_a_point_invalid_in_every_run():
    from k25exp.report.spec_sweep import spec_sweep

    # one drafter, k = 3, α 0.5 / 0.7 / 0.9 at c = 4 and 16; the α 0.9, c = 16 point is invalid
    # in its only run and measured absurdly (100 ms): were it fitted, the other c = 16 points'
    # projections would move
    steps = []
    for a, tau in ((0.5, 1.9), (0.7, 2.5), (0.9, 3.4)):
        steps.append(point(f"a{a}", 4, 10.0 * 1.0 / tau + 2.0, 10.0, tau))
        bad = a == 0.9
        steps.append(point(f"a{a}", 16, 100.0 if bad else 20.0 / tau + 4.0, 20.0, tau))
        steps.append(with_valid(f"a{a}", 16, not bad))
    r = run(1, levels(*steps), **{"experiment.alphas": "[0.5, 0.7, 0.9]"})
    sec = spec_sweep(Campaign("c", "uri", [r]))
    table = next(t for t in sec.tables if t.title == "Measured and projected speedup per point")
    rows = {(row[2], row[3]): dict(zip(table.columns, row)) for row in table.rows}
    bad = rows[(0.9, 16)]
    assert bad["projected ×"] is None and bad["runs left out"] == "all (1)"
    assert bad["projection used"].startswith("not projected")
    # the other c = 16 points were fitted on 4 valid others, not 5
    assert "fit over 4 other points" in rows[(0.5, 16)]["projection used"]
    assert "1 point(s) invalid in every run, not projected" in sec.figures[0].note


def test_a_run_whose_point_shared_its_host_is_left_out_and_rounds_it_left_out_add_up():
    # two runs at c = 4, both valid: the first ran every round on a shared host (host_shared
    # 1: its medians are slowed, 8 ms), the second left one round out itself (rounds 2 of 3,
    # rounds_left_out 1); a third run from before host_shared was logged counts as alone
    shared = run(1, levels(point("a0.7", 4, 8.0, 10.0, 2.5), with_valid("a0.7", 4, True),
                           {"a0.7/host_shared": {4: 1.0}, "a0.7/rounds_left_out": {4: 0.0}}))
    clean = run(2, levels(point("a0.7", 4, 5.0, 10.0, 2.5), with_valid("a0.7", 4, True),
                          {"a0.7/host_shared": {4: 0.0}, "a0.7/rounds_left_out": {4: 1.0},
                           "a0.7/rounds": {4: 2.0}}))
    old = run(3, levels(point("a0.7", 4, 4.0, 10.0, 2.5)))
    (p,) = points_of([shared, clean, old])
    # by hand: the medians of runs 2 and 3 (5 and 4 ms: 4.5; 10/5 = 2, 10/4 = 2.5: 2.25),
    # rounds 2 + 3, one run left out, one round left out inside the kept runs
    assert (p.spec_ms, p.speedup, p.rounds, p.left_out, p.rounds_left_out, p.valid) == (
        4.5, 2.25, 5, 1, 1, True)
    assert {r.run_id for r in p.run} == {clean.run_id, old.run_id}
    assert not p.shared
    # no run alone on its host: the valid shared one stays, marked shared (fitted all the same)
    (q,) = points_of([shared])
    assert (q.spec_ms, q.left_out, q.valid, q.shared) == (8.0, 0, True, True)
