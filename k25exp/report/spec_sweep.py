"""The speculative points the spec_decode runs measured (drafter × k × acceptance ×
concurrency, each over its rounds), every point projected from the others by the fitted step
model (k25exp.report.spec_model), the break-even acceptance per concurrency, the split of
each point's gap to the ideal and the speedup surface.

A run logs its points as `<acceptance>/<figure>` at step = concurrency
(k25exp.runners.spec_decode_results): acceptance `a0.7` (synthetic α) or `model` (as the
drafter achieves), `k3/a0.7` in a job of several draft lengths. Synthetic and as-the-model
points are never fitted together: the drafter a fit is for names both its method and its
acceptance mode.
"""

from __future__ import annotations

import re
from statistics import median
from typing import Sequence

from k25exp.report import metrics as M
from k25exp.report.figures import Figure, Section, Table, missing, unique_runs
from k25exp.report.sources import Campaign
from k25exp.report.spec_profiled import spec_profiled
from k25exp.report.spec_model import (Point, Projection, break_even, fit_step, project,
                                      reaches, speedup_at)
from k25exp.report.speculative import method_label
from k25exp.telemetry.host_cpu import prefer_alone
from k25exp.traces.step_phases import ASYNC_KEPT
from k25exp.tracking.read import RunView

_POINT = re.compile(r"^((?:k\d+/)?(?:a[0-9.]+|model))/spec_tpot_ms_med$")


def drafter_name(r: RunView) -> str:
    """What a fit is for: the method and its draft (speculative.method_label), and the
    acceptance mode."""
    mode = r.params.get("experiment.acceptance", "as_model")
    return f"{method_label(r)} [{'synthetic' if mode == 'synthetic' else 'as model'}]"


FIELDS = ("spec_tpot_ms_med", "base_tpot_ms_med", "sync_tpot_ms_med", "tokens_per_step_med",
          "speedup_med", "speedup_ci_lo", "speedup_ci_hi", "rounds", "valid", "host_shared",
          "rounds_left_out")


def points_of(runs: list[RunView]) -> list[Point]:
    """The measured points of one setting's runs (none from runs that predate points). Runs
    of one setting pool: each figure the median of the runs' medians, the rounds summed, the
    speedup's interval a bootstrap over the runs' speedups (a run's own with one run). A run
    whose point is marked invalid (`<point>/valid` 0: a client that lagged, a level that
    stalled, in any of its servers) or shared its host in every round (`<point>/host_shared`
    1: other processes used the CPUs, telemetry.host_cpu; a run leaves such rounds out
    itself while it has others, counted in `rounds_left_out`) is left out of that point and
    counted in `left_out`. With no run alone on its host, the valid ones stay, the point
    marked `shared` (fitted and projected, and the table says so); with no valid run, all
    stay and the point is marked `valid=False` (listed, never fitted or projected). Runs from
    before `valid` or `host_shared` were logged count as valid and alone on their host."""
    from k25exp.stats import bootstrap_ci

    r0 = runs[0]
    k_job = r0.param("experiment.num_speculative_tokens", int)
    # the reference step (spec_model): the baseline with the drafter's scheduling
    async_kept = r0.params.get("experiment.method") in ASYNC_KEPT
    p_tok = r0.param("experiment.input_tokens", int, 0)
    n_out = r0.param("experiment.output_tokens", int, 0)
    names = sorted({m.group(1) for r in runs for key in r.metrics if (m := _POINT.match(key))})
    out = []
    for name in names:
        k_part, _, acc = name.rpartition("/")   # k3/a0.7 (a job of several k) or a0.7
        k = int(k_part[1:]) if k_part else k_job
        alpha = None if acc == "model" else float(acc[1:])
        per_run = [{f: r.history(f"{name}/{f}") for f in FIELDS} for r in runs]
        levels = sorted({c for h in per_run for c in h["spec_tpot_ms_med"]})
        for c in levels:
            have = [h for h in per_run if all(h[f].get(c) is not None for f in (
                "spec_tpot_ms_med", "base_tpot_ms_med", "tokens_per_step_med", "speedup_med"))]
            if not have:
                continue
            kept, how = prefer_alone(have, lambda h: h["valid"].get(c, 1.0) >= 1.0,
                                     lambda h: bool(h["host_shared"].get(c, 0.0)))
            left_out = len(have) - len(kept) if how != "invalid" else 0
            have = kept
            med = {f: median(vals) if (vals := [h[f][c] for h in have if c in h[f]]) else None
                   for f in FIELDS}
            speedups = [h["speedup_med"][c] for h in have]
            if len(have) > 1:
                lo, hi = bootstrap_ci(speedups)
            else:
                lo, hi = med["speedup_ci_lo"], med["speedup_ci_hi"]
            out.append(Point(drafter_name(r0), k, alpha, int(c), med["base_tpot_ms_med"],
                             med["spec_tpot_ms_med"], med["tokens_per_step_med"], med["speedup_med"],
                             p_tok, n_out, run=tuple(r for r, h in zip(runs, per_run) if h in have),
                             sync_ms=med["sync_tpot_ms_med"], speedup_lo=lo, speedup_hi=hi,
                             ref_ms=None if async_kept else med["sync_tpot_ms_med"],
                             rounds=int(sum(h["rounds"].get(c, 1) for h in have)),
                             left_out=left_out, valid=how != "invalid", shared=how == "shared",
                             rounds_left_out=int(sum(h["rounds_left_out"].get(c, 0) for h in have))))
    return out


def _settings(c: Campaign) -> list[list[RunView]]:
    """The campaign's spec_decode runs grouped by setting (method, draft, k, acceptance mode
    and α's, model, TP), newest first within a group."""
    groups: dict[tuple, list[RunView]] = {}
    for r in c.of("spec_decode"):
        key = tuple(_param(r, k) for k in (
            "experiment.method", "experiment.draft_model", "experiment.num_speculative_tokens",
            "experiment.draft_lengths", "experiment.baseline_beside", "experiment.acceptance", "experiment.alphas", "experiment.prompt_lookup_min",
            "experiment.prompt_lookup_max", "experiment.input_tokens", "experiment.output_tokens",
            "model.name", "server.tp"))
        groups.setdefault(key, []).append(r)
    return list(groups.values())


UNSET = {"experiment.draft_lengths": "[]", "experiment.baseline_beside": "False"}


def _param(r: RunView, key: str):
    """A setting's param; a key unset (runs before it existed, or null) reads as its default
    (draft_lengths [], baseline_beside False)."""
    v = r.params.get(key)
    return (v if v not in (None, "null", "None") else UNSET[key]) if key in UNSET else v


def spec_sweep(c: Campaign, alphas: Sequence[float] = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
               ) -> Section:
    """The section (module docstring); `alphas`: the surface's acceptance axis."""
    sec = Section("Speculative decoding: measured points, projected from the other points' steps")
    points = [p for runs in _settings(c) for p in points_of(runs)]
    if not points:
        sec.figures.append(missing(M.SPEC_MODEL_ERR_MAX, "no spec_decode run with measured "
                                   "points (" + c.why_missing("spec_decode") + ")"
                                   if not c.of("spec_decode") else "no spec_decode run with "
                                   "measured points: its runs predate them"))
        spec_profiled(sec=sec, c=c)
        return sec
    # a point every run marked invalid is listed but neither fitted nor projected
    valid = [p for p in points if p.valid]
    projections = project(valid) + [Projection(p, None, None, None, "not projected: marked "
                                               f"invalid in every run ({len(p.run)})")
                                    for p in points if not p.valid]
    rows, errors, inside = [], [], 0
    for pr in projections:
        p = pr.point
        err = pr.error_pct
        if err is not None:
            errors.append(abs(err))
            inside += bool(pr.in_interval)
        rows.append([p.drafter, p.k, "model" if p.alpha is None else p.alpha, p.c, p.rounds,
                     p.rounds_left_out, p.left_out if p.valid else f"all ({len(p.run)})",
                     _yes_no(p.shared),
                     p.base_ms, p.sync_ms, p.spec_ms, p.tau, p.speedup, p.speedup_lo, p.speedup_hi,
                     pr.speedup, err, _yes_no(pr.in_interval), p.step_ms, pr.step_ms, pr.used,
                     *p.run[:1]])
    runs = unique_runs([r for p in points for r in p.run])
    left = sum(p.left_out for p in points if p.valid)
    dropped = len(points) - len(valid)
    rounds_out = sum(p.rounds_left_out for p in points if p.valid)
    shared = sum(p.shared for p in points)
    why = (f"; {rounds_out} round(s) left out by their runs (invalid or on a shared host)"
           if rounds_out else "") + (
        f"; {left} run(s) left out of their points (invalid or on a shared host)" if left
        else "") + (
        f"; {dropped} point(s) invalid in every run, not projected" if dropped else "") + (
        f"; {shared} point(s) measured only on a shared host (kept, marked)" if shared else "")
    if errors:
        sec.figures.append(Figure(M.SPEC_MODEL_ERR_MAX, max(errors), runs,
                                  f"{len(errors)} of {len(points)} points projected; median "
                                  f"|error| {median(errors):.1f} %; "
                                  f"{sum(e <= 10.0 for e in errors)} within 10 %, {inside} inside "
                                  f"the measured speedup's interval{why}"))
    else:
        sec.figures.append(missing(M.SPEC_MODEL_ERR_MAX, "no point could be projected (too few "
                                   f"points per drafter{why})", runs))
    sec.tables.append(Table(
        "Measured and projected speedup per point",
        ["drafter", "k", "α", "c", "rounds", "rounds left out", "runs left out", "shared host",
         "base TPOT ms",
         "base sync ms", "spec TPOT ms", "tokens/step", "measured ×", "× CI lo", "× CI hi",
         "projected ×", "error %", "inside CI", "measured step ms", "projected step ms", "projection used", "run"], rows,
        "TPOT p50 medians over the rounds; measured × = median over rounds of baseline / spec "
        "TPOT (bootstrap 95 % interval); tokens/step = 1 + accepted/drafts (vLLM's counters); "
        "measured step = spec TPOT × tokens/step; projected step = the reference step measured "
        "at the same c (base sync for a drafter that turns async scheduling off, else base) + "
        "what speculation adds, fitted on the drafter's other points (k25exp.report.spec_model; "
        "never the point's own speculative measurement); inside CI = the projection lies in the "
        "measured × interval (3 rounds on a loaded machine can move a speedup by more than 10 %); "
        "base sync = the baseline with --no-async-scheduling; rounds left out = rounds a run "
        "left out of its own medians, runs left out = runs whose point was, both because a "
        "server of theirs was invalid there (a lagging client, a stalled level) or its host "
        "was shared (other processes used more than validity.host_other_cores_max cores: "
        "host_shared); shared host = no run of the point had its host alone (kept, fitted, to be "
        "read with that in mind); 'all' = no valid run: listed, never fitted"))
    _gap_split(sec, valid)
    _break_even(sec, valid, alphas)
    spec_profiled(c, sec)
    return sec


def _yes_no(x) -> str:
    return "" if x is None else ("yes" if x else "no")


def _gap_split(sec: Section, points: list[Point]) -> None:
    """Per point, spec TPOT against the ideal base/τ (a verification as cheap as an ordinary
    step at the same scheduling, a free drafter): the part the scheduling explains (the
    baseline without async scheduling, per emitted token) and the rest (verification of k+1
    tokens per request, the drafter, the rejection sampler: apart only in a profile)."""
    rows = []
    for p in points:
        if p.sync_ms is None:
            continue
        ideal = p.base_ms / p.tau
        sched = (p.sync_ms - p.base_ms) / p.tau
        rest = p.spec_ms - p.sync_ms / p.tau
        rows.append([p.drafter, p.k, "model" if p.alpha is None else p.alpha, p.c, p.spec_ms,
                     ideal, p.spec_ms - ideal, sched, rest])
    if rows:
        sec.tables.append(Table(
            "Where each point's TPOT goes beyond the ideal (ms per token)",
            ["drafter", "k", "α", "c", "spec TPOT", "ideal base/τ", "gap", "scheduling",
             "verification + drafter + sampler"], rows,
            "ideal = baseline TPOT / tokens per step; scheduling = (baseline without async "
            "scheduling − baseline) / τ; the rest = spec TPOT − baseline-sync TPOT / τ. "
            "Verification, drafter and rejection sampler are told apart only by a profile of "
            "the speculative server"))


def _break_even(sec: Section, points: list[Point], alphas: Sequence[float]) -> None:
    """Per drafter, k and concurrency: the α where the fitted model's speedup is 1, and the
    surface of speedups over α (plot) at each concurrency, for the drafter's best k."""
    rows, series = [], {}
    groups = sorted({(p.drafter, p.k) for p in points})
    for drafter, k in groups:
        mine = [p for p in points if p.drafter == drafter]
        fit = fit_step(mine)
        if fit is None:
            continue
        at_k = sorted({p.c: p for p in mine if p.k == k}.values(), key=lambda p: p.c)
        phi = median(r) if (r := reaches(mine, drafter, k)) else 1.0
        for p in at_k:
            a = break_even(k, p.c, p.base_ms, p.reference_ms, fit, p.prompt_tokens, p.output_tokens, phi)
            rows.append([drafter, k, p.c, p.base_ms, phi, a if a is not None else "never (α = 1 < ×1)"])
            series[f"{drafter} k={k} c={p.c}"] = [
                speedup_at(x, k, p.c, p.base_ms, p.reference_ms, fit, p.prompt_tokens, p.output_tokens,
                           phi)
                for x in alphas]
    if rows:
        sec.tables.append(Table("Break-even acceptance per concurrency (fitted step model)",
                                ["drafter", "k", "c", "base TPOT ms", "φ", "break-even α"], rows,
                                "the per-token acceptance α at which the projected speedup over "
                                "the measured baseline is 1; 0 = pays at any acceptance; φ = the "
                                "drafter's reach at this k (position i proposed with probability "
                                "φ^i, so τ = E(φα, k); median over its points)"))
        sec.plot = {"kind": "sweep", "file": "spec_surface.png", "x": list(alphas),
                    "series": series, "xlabel": "per-token acceptance α",
                    "ylabel": "projected speedup over the baseline",
                    "title": "Speculative decoding: speedup over acceptance, per concurrency",
                    "logx": False}
