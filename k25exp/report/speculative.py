"""Speculative decoding at batch 1, as each spec_decode setting measured it, and the labels
of a setting the report's speculative sections share.

    E(α, k)   expected tokens per verification step = (1 − α^(k+1)) / (1 − α); k+1 at α = 1
              (k25exp.serving.spec_acceptance)
    α_eff     of a measured run: the α whose E(α, k) equals its tokens per decode step
              (single_stream_tokens_per_chunk: streamed tokens per chunk at batch 1), so steps
              without a draft count

What a setting would give at other acceptances and levels is projected from measured steps
(k25exp.report.spec_model, the section of k25exp.report.spec_sweep); the closed form that
priced a verification step as the macro's TPOT at concurrency k + 1 (Leviathan et al. 2023)
erred by 24–86 % against the measured step and is gone.
"""

from __future__ import annotations


from k25exp.config.spec_methods import EAGLE3_HEAD
from k25exp.report import metrics as M
from k25exp.report.figures import Figure, Section, Table, missing
from k25exp.report.sources import Campaign
from k25exp.serving.spec_acceptance import expected_tokens  # E(α, k)
from k25exp.serving.speculative import MODEL_FREE  # no model: drafting costs host time only
from k25exp.tracking.read import RunView


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


def method_label(r: RunView) -> str:
    """The method, and what drafts for it: 'ngram', 'draft_model (self-draft)', 'eagle3 (draft X)'."""
    method, d = r.params.get("experiment.method"), r.params.get("experiment.draft_model")
    if method == "draft_model" and d == "self":  # the target drafts: k full passes
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


def speculative(c: Campaign) -> Section:
    """One figure and one row per spec_decode setting (newest run of each): its single-stream
    speedup over its own baseline, the acceptance and tokens per step it ran at."""
    sec = Section("Speculative decoding at batch 1, as measured")
    specs, seen = [], set()
    for r in c.of("spec_decode"):  # newest first: one run per distinct setting
        if spec_key(r) not in seen:
            seen.add(spec_key(r))
            specs.append(r)
    if not specs:
        sec.figures.append(missing(M.SPEC_MEASURED_NONE, c.why_missing("spec_decode")))
        return sec
    rows = []
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
        step_meas = tpot * per_step if tpot is not None and per_step is not None else None
        rows.append([label, acc, per_step, a_eff, base, tpot, speedup, step_meas, r])
        sec.figures.append(Figure(M.spec_measured(label), speedup, [r],
                                  f"acceptance {acc if acc is not None else float('nan'):.3f}, "
                                  f"{per_step if per_step else float('nan'):.2f} tokens per step")
                           if speedup is not None else
                           missing(M.spec_measured(label), "the run has no baseline"))
    sec.tables.append(Table("Measured at batch 1", [
        "setting", "acceptance", "tokens/step", "α_eff", "base TPOT ms", "spec TPOT ms",
        "measured ×", "measured step ms", "run"], rows,
        "single-stream phase (one request at a time); tokens/step = streamed tokens per chunk; "
        "measured × = the run's own baseline TPOT / spec TPOT; measured step = spec TPOT × "
        "tokens/step. Other acceptances and levels: the measured-points section"))
    return sec
