"""The speculative step as profiled: each spec_profile run's decode cycle (verification,
rejection sampler, drafter, host) beside its baselines' at the same level, and the spec
cycle's excess over the baseline's split into scheduling, verification, sampler, drafter and
host (k25exp.traces.step_phases.gap_split).

A baseline comes from the spec_profile run itself (`baseline/…`, `baseline_sync/…`, when it
captured them) or else from the campaign's newest profile run at the same concurrency, request
shape, model and TP: without --no-async-scheduling in server.extra_args for the baseline,
with it for baseline_sync. Figures are under the profiler (its slowdown is in every cycle);
the unprofiled TPOTs the same jobs measured on the same server starts are given beside.

A run stopped before it finished (a stage's time limit while its baseline server started,
say) keeps what it captured: the speculative server's phases stand on their own once logged,
as a macro level does, and the runs column gives its status.
"""

from __future__ import annotations

import json
from typing import Optional

from k25exp.report.figures import Section, Table
from k25exp.report.sources import Campaign
from k25exp.report.speculative import method_label
from k25exp.traces.step_phases import gap_split, schedules_as_baseline
from k25exp.tracking.read import RunView

PHASE_KEYS = ("phase_cycle_ms", "phase_verify_ms", "phase_sample_ms", "phase_draft_ms",
              "phase_bookkeep_ms", "phase_other_ms", "phase_gap_ms")
SYNC_FLAG = "--no-async-scheduling"
SAME = ("experiment.concurrency", "experiment.input_tokens", "experiment.output_tokens",
        "model.name", "server.tp")


def _phases(r: RunView, prefix: str = "") -> Optional[dict[str, float]]:
    got = {k: r.metrics.get(prefix + k) for k in PHASE_KEYS}
    if any(v is None for v in got.values()):
        return None
    got["unprofiled_tpot_ms_mean"] = r.metrics.get(prefix + "unprofiled_tpot_ms_mean")
    return got  # type: ignore[return-value]


def _baseline(c: Campaign, spec: RunView, sync: bool) -> tuple[Optional[dict[str, float]], str]:
    """(phases, where from) of the baseline (sync: without async scheduling) at spec's level."""
    own = _phases(spec, "baseline_sync/" if sync else "baseline/")
    if own is not None:
        return own, spec.short
    for r in sorted(c.of("profile"), key=lambda r: -r.start_time):
        if all(r.params.get(k) == spec.params.get(k) for k in SAME) and \
                (SYNC_FLAG in r.params.get("server.extra_args", "")) == sync:
            if (ph := _phases(r)) is not None:
                return ph, r.short
    return None, ""


def _which(r: RunView) -> str:
    """The run's short id; with its status when it did not finish (its capture did)."""
    return r.short if r.status == "FINISHED" else f"{r.short} ({r.status}: stopped after its capture)"


def _alpha(r: RunView) -> Optional[float]:
    if r.params.get("experiment.acceptance") != "synthetic":
        return None
    return float(json.loads(r.params.get("experiment.alphas", "[]"))[0])


def spec_profiled(c: Campaign, sec: Section) -> None:
    """The two tables (module docstring) into `sec`, when the campaign has spec_profile runs."""
    rows, split_rows = [], []
    for r in sorted(c.of("spec_profile", status=None), key=lambda r: (
            method_label(r), r.param("experiment.num_speculative_tokens", int, 0),
            _alpha(r) or 0.0, r.param("experiment.concurrency", int, 0))):
        spec = _phases(r)
        if spec is None:
            continue
        base, base_from = _baseline(c, r, sync=False)
        sync, sync_from = _baseline(c, r, sync=True)
        tau = r.metrics.get("spec_expected_tokens_per_step")
        k = r.param("experiment.num_speculative_tokens", int)
        alpha = _alpha(r)
        method = r.params.get("experiment.method", "")
        host_draft = r.metrics.get("phase_host_draft_ms")
        b_tpot, s_tpot = (base or {}).get("unprofiled_tpot_ms_mean"), spec["unprofiled_tpot_ms_mean"]
        rows.append([method_label(r), k, "model" if alpha is None else alpha,
                     r.param("experiment.concurrency", int), tau, spec["phase_cycle_ms"],
                     spec["phase_verify_ms"], spec["phase_sample_ms"], spec["phase_draft_ms"],
                     host_draft, spec["phase_gap_ms"] + spec["phase_bookkeep_ms"] + spec["phase_other_ms"],
                     base and base["phase_cycle_ms"], sync and sync["phase_cycle_ms"],
                     base["phase_cycle_ms"] * tau / spec["phase_cycle_ms"] if base and tau else None,
                     b_tpot / s_tpot if b_tpot and s_tpot else None,
                     " ".join(x for x in (_which(r), base_from, sync_from) if x)])
        kept = schedules_as_baseline(method, r.params.get("hardware.device", ""))
        if base is not None and (kept or sync is not None):
            parts = gap_split(spec, base, sync, kept)
            split_rows.append([method_label(r), k, "model" if alpha is None else alpha,
                               r.param("experiment.concurrency", int), parts["total"],
                               *(parts[p] for p in ("scheduling", "verification", "sampler",
                                                    "drafter", "host")),
                               "baseline" if kept else "baseline_sync"])
    if not rows:
        return
    sec.tables.append(Table(
        "The speculative step, profiled (ms per decode cycle, under the profiler)",
        ["drafter", "k", "α", "c", "tokens/step", "spec cycle", "verify", "sampler", "drafter",
         "drafter (host)", "host gap", "base cycle", "base sync cycle", "profiled ×",
         "unprofiled ×", "runs (spec, base, sync)"], rows,
        "a cycle: one decode step's start to the next step's start, split by vLLM's model-runner "
        "scopes (k25exp.traces.step_phases); host gap = none of them, bookkeeping and other "
        "scopes; drafter (host) = the drafter scope on the host (a GPU trace's n-gram drafter "
        "launches no kernel: its time is in the host gap there); tokens/step = E(α, k); "
        "profiled × = base cycle × tokens/step / spec cycle; unprofiled × = the baseline's / the "
        "spec server's TPOT over the level sent without the profiler on the same starts"))
    if split_rows:
        sec.tables.append(Table(
            "The speculative cycle's excess over the baseline's, by part (ms per cycle)",
            ["drafter", "k", "α", "c", "spec − base", "scheduling", "verification", "sampler",
             "drafter", "host", "reference"], split_rows,
            "parts sum to spec − base exactly (k25exp.traces.step_phases.gap_split): scheduling = "
            "baseline without async scheduling − baseline (0 for a drafter that keeps async "
            "scheduling); verification, sampler, host = the spec server's phase − the reference's "
            "(baseline_sync for a drafter that turns async scheduling off, else the baseline); "
            "drafter = its scope"))
