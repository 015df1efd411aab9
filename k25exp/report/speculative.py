"""Speculative decoding, projected and measured (Leviathan et al. 2023): per-token acceptance
α, draft length k.

    E(α, k)        expected tokens per verification step = (1 − α^(k+1)) / (1 − α); k+1 at α=1
    step_ms        T_verify(k+1) + k × T_draft: T_verify(k+1) = macro's TPOT p50 at
                   concurrency k+1 (a step that carries k+1 tokens); T_draft = 0 for n-gram
                   lookup, the batch-1 TPOT for a draft as large as the target (self-draft)
    tpot_proj      step_ms / E(α, k); speedup = tpot_ms / tpot_proj
    α_eff          of a measured run: the α whose E(α, k) equals its tokens per decode step
                   (single_stream_tokens_per_chunk: streamed tokens per chunk at batch 1), so
                   steps without a draft count; the projection at α_eff differs from the
                   measurement only through the step cost
"""

from __future__ import annotations

from typing import Optional, Sequence

from k25exp.config.spec_methods import EAGLE3_HEAD
from k25exp.report import metrics as M
from k25exp.report.figures import Figure, Section, Table, missing, unique_runs
from k25exp.report.sources import Campaign, RunView
from k25exp.serving.spec_acceptance import expected_tokens  # E(α, k)
from k25exp.serving.speculative import MODEL_FREE  # no model: drafting costs host time only


def effective_alpha(mean_accepted: float, k: int) -> float:
    """The i.i.d. per-token acceptance whose E(α, k) − 1 equals `mean_accepted` (bisection)."""
    if mean_accepted <= 0:
        return 0.0
    if mean_accepted >= k:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if expected_tokens(mid, k) - 1.0 < mean_accepted:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


SPEC_PARAMS = ("experiment.method", "experiment.num_speculative_tokens", "experiment.draft_model",
               "experiment.prompt_lookup_min", "experiment.prompt_lookup_max")


def spec_key(r: RunView) -> tuple:
    """What makes two spec_decode runs different settings (extra.* flattened per key)."""
    return tuple(r.params.get(k) for k in SPEC_PARAMS) + tuple(sorted(
        (k, v) for k, v in r.params.items() if k.startswith("experiment.extra.")))


def drafter(r: RunView) -> str:
    """'free' (n-gram, suffix), 'self' (the target drafts: k full passes) or 'unknown'."""
    method = r.params.get("experiment.method")
    if method in MODEL_FREE:
        return "free"
    if method == "draft_model" and r.params.get("experiment.draft_model") == "self":
        return "self"
    return "unknown"


def method_label(r: RunView) -> str:
    """The method, and what drafts for it: 'ngram', 'draft_model (self-draft)', 'eagle3 (draft X)'."""
    method, d = r.params.get("experiment.method"), r.params.get("experiment.draft_model")
    if drafter(r) == "self":
        return f"{method} (self-draft)"
    if d == EAGLE3_HEAD:
        return f"{method} (head built from the target)"
    if method not in MODEL_FREE and d not in (None, "null", "None", "self"):
        return f"{method} (draft {d.rstrip('/').rsplit('/', 1)[-1]})"
    return str(method)


def spec_label(r: RunView) -> str:
    method, _, what = method_label(r).partition(" ")
    label = f"{method} k={r.params.get('experiment.num_speculative_tokens')}" + (f" {what}" if what else "")
    extra = [f"{k[len('experiment.extra.'):]}={v}" for k, v in sorted(r.params.items())
             if k.startswith("experiment.extra.")]
    return label + (f" [{', '.join(extra)}]" if extra else "")


def speculative(c: Campaign, alphas: Sequence[float], draft_lengths: Sequence[int]) -> Section:
    sec = Section("Speculative decoding: projected and measured")
    macro = c.closed_loop_macro(lambda r: "single_stream_tpot_ms" in r.metrics)
    specs, seen = [], set()
    for r in c.of("spec_decode"):  # newest first: one run per distinct setting
        if spec_key(r) not in seen:
            seen.add(spec_key(r))
            specs.append(r)
    if not macro:
        sec.figures.append(missing(M.SPEC_PROJECTION, c.why_no_closed_loop_macro() +
                                   " (its TPOT per concurrency is the verification cost)"))
    cost = StepCost(macro)
    lagged = sorted(lvl for lvl, v in (macro.history("valid") if macro else {}).items()
                    if not v and lvl in cost.levels)
    if lagged:
        sec.notes.append(f"macro run {macro.short}: levels {lagged} are flagged invalid (client "
                         "lag or delivery stalls); their TPOT is still used as a verification cost")
    grid_ks = [k for k in draft_lengths if (k + 1) in cost.levels]
    if macro:
        _projected_grid(sec, macro, cost, alphas, draft_lengths, grid_ks)
    points = _measured_runs(sec, specs, macro, cost, alphas)
    if not specs:
        sec.figures.append(missing(M.SPEC_MEASURED_NONE, c.why_missing("spec_decode")))
    if macro and grid_ks:
        sec.plot = {"kind": "spec", "alphas": list(alphas),
                    "series": {f"k={k}, free drafter": [cost.t1 / (cost.step_ms(k, False) / expected_tokens(a, k))
                                                        for a in alphas] for k in grid_ks},
                    "points": points}
    return sec


class StepCost:
    """The verification step's cost from a macro run: its TPOT p50 at concurrency k+1, plus
    k × its batch-1 TPOT when the target drafts for itself."""

    def __init__(self, macro: Optional[RunView]):
        self.t1 = macro.metrics["single_stream_tpot_ms"] if macro else None
        self.levels = macro.history("tpot_ms_p50") if macro else {}

    def step_ms(self, k: int, drafter_full: bool) -> Optional[float]:
        v = self.levels.get(k + 1)
        return None if v is None else v + (k * self.t1 if drafter_full else 0.0)


def _projected_grid(sec: Section, macro: RunView, cost: StepCost, alphas: Sequence[float],
                    draft_lengths: Sequence[int], grid_ks: list[int]) -> None:
    """Projected speedup over batch-1 TPOT for each α and k, one table per kind of drafter."""
    skipped = [k for k in draft_lengths if k not in grid_ks]
    if skipped:
        sec.notes.append(f"draft lengths {skipped} left out of the grid: macro run {macro.short} "
                         f"has no level at concurrency k+1 (its levels: {sorted(cost.levels)})")
    for full, title in ((False, "n-gram (free drafter)"), (True, "self-draft (drafter = target)")):
        rows = [[a] + [cost.t1 / (cost.step_ms(k, full) / expected_tokens(a, k)) for k in grid_ks]
                for a in alphas]
        sec.tables.append(Table(f"Projected speedup over batch-1 TPOT, {title}",
                                ["α"] + [f"k={k}" for k in grid_ks], rows,
                                f"TPOT {cost.t1:.3f} ms; verification = macro TPOT at "
                                f"concurrency k+1 (run {macro.short})"))


def _measured_runs(sec: Section, specs: list[RunView], macro: Optional[RunView], cost: StepCost,
                   alphas: Sequence[float]) -> list[tuple]:
    """Each spec_decode setting measured against its projection: figures, the comparison table
    and the what-if table; the (label, α_eff, measured, projected) points for the plot."""
    rows, points, what_if = [], [], []
    labels = [spec_label(r) for r in specs]
    for r, label in zip(specs, labels):
        if labels.count(label) > 1:  # settings the label can't tell apart
            label = f"{label} #{r.short}"
        k = r.param("experiment.num_speculative_tokens", int)
        acc = r.metrics.get("single_stream_acceptance_rate")
        tpot = r.metrics.get("single_stream_tpot_ms")
        base = r.metrics.get("baseline/single_stream_tpot_ms")
        speedup = r.metrics.get("spec_speedup")
        # Tokens per decode step as the client received them (one chunk per engine step at
        # batch 1), steps without a draft included. Not 1 + accepted/drafts: vLLM's accepted
        # counter also counts tokens accepted past max_tokens and then dropped.
        per_step = r.metrics.get("single_stream_tokens_per_chunk")
        base_chunk = r.metrics.get("baseline/single_stream_tokens_per_chunk")
        if base_chunk is not None and base_chunk > 1.02:
            sec.notes.append(f"run {r.short}: its baseline streamed {base_chunk:.3f} tokens per chunk "
                             "(1 when every step is its own chunk): the server coalesced steps, so "
                             "tokens/step of the speculative server is overstated too")
        a_eff = effective_alpha(per_step - 1, k) if per_step is not None else None
        kind = drafter(r)
        step = cost.step_ms(k, kind == "self") if kind != "unknown" else None
        proj_tpot = step / expected_tokens(a_eff, k) if a_eff is not None and step is not None else None
        # over the run's own baseline, like the measured speedup: the two then differ only
        # through the step cost
        proj = base / proj_tpot if proj_tpot and base else None
        step_meas = tpot * per_step if tpot is not None and per_step is not None else None
        rows.append([label, acc, per_step, a_eff, base, tpot, proj_tpot, speedup, proj, step_meas,
                     step, r])
        points.append((label, a_eff, speedup, proj))
        sec.figures.append(Figure(M.spec_measured(label), speedup, [r],
                                  f"acceptance {acc if acc is not None else float('nan'):.3f}, "
                                  f"{per_step if per_step else float('nan'):.2f} tokens per step")
                           if speedup is not None else
                           missing(M.spec_measured(label), "the run has no baseline"))
        if proj is not None:
            sec.figures.append(Figure(M.spec_projected(label), proj, unique_runs([r, macro]),
                                      f"at its α_eff {a_eff:.3f}"))
        else:
            why = (f"the drafting cost of method {r.params.get('experiment.method')} with draft "
                   f"{r.params.get('experiment.draft_model')} is not measured by any phase"
                   if kind == "unknown" else
                   "needs macro TPOT at concurrency k+1, the run's baseline and its tokens per step")
            sec.figures.append(missing(M.spec_projected(label), why))
        if step_meas is not None and base:
            # this run's measured cost of one verification step, at other acceptance rates
            what_if.append([label] + [base / (step_meas / expected_tokens(a, k)) for a in alphas] + [r])
    if specs:
        sec.tables.append(Table("Measured against projected (batch 1)",
                                ["setting", "acceptance", "tokens/step", "α_eff", "base TPOT ms",
                                 "spec TPOT ms", "projected TPOT ms", "measured ×", "projected ×",
                                 "measured step ms", "projected step ms", "run"], rows,
                                "tokens/step = streamed tokens per chunk at batch 1; measured "
                                "step = spec TPOT × tokens/step; projected step = macro TPOT at "
                                "k+1 (+ k × TPOT for a self-draft); both speedups are over the "
                                "run's own baseline; the projected step keeps the baseline's "
                                "scheduling: a server that turns async scheduling off for its "
                                "drafter (vLLM 0.26 does for n-gram, its log says so) runs host "
                                "work between steps that the projection does not price"))
    if what_if:
        sec.tables.append(Table("Speedup at other acceptance rates, at each run's measured step cost",
                                ["setting"] + [f"α={a:g}" for a in alphas] + ["run"], what_if,
                                "base TPOT / (measured step ms / E(α, k)): what a drafter of the "
                                "same cost with another acceptance would give"))
    return points
