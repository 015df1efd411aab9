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
