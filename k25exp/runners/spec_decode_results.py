"""spec_decode's points: every measurement's levels gathered, then per (acceptance, level) the
median over rounds, the spread and the speedup with its interval; the table and the metrics.

A point is (α, concurrency) of one job's drafter at one k (a job of several draft lengths,
experiment.draft_lengths, names its points k<k>/a<α>; their baseline is the round's one). Per
round r the speedup is baseline TPOT p50 / speculative TPOT p50 at that level (the round pairs
servers measured minutes apart; with experiment.baseline_beside the baseline is the mean of the
two measured just before and after the speculative server: paired_base); the point's speedup is the median over rounds, with min–max and a bootstrap
95 % interval of the median (stats.bootstrap_ci; none with one round). A round whose
servers at that level were invalid (client lag, a stall) or ran on a shared host (other
processes used the CPUs: host_shared, k25exp.telemetry.host_cpu) is left out of the point and
counted (rounds_left_out); a point with no usable round keeps its valid rounds on a shared
host (marked host_shared), or with none valid all of them (marked invalid). The step a
verification takes, as measured: speculative TPOT × tokens per step, where tokens per step is
the server's mean acceptance length (1 + accepted / drafts, vLLM's counters over the level).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from statistics import median
from typing import Optional

from k25exp import tables
from k25exp.config.experiments import SpecDecodeConfig
from k25exp.config.experiments.serving import spec_point_name
from k25exp.stats import bootstrap_ci
from k25exp.telemetry.host_cpu import prefer_alone
from k25exp.tracking.recorder import Capture, Recorder

# per level, from each measurement (the macro's names)
LEVEL_KEYS = ("tpot_ms_p50", "tpot_ms_mean", "output_tok_s", "tokens_per_chunk",
              "mean_acceptance_length", "acceptance_rate", "acceptance_pos0", "spec_drafts",
              "spec_draft_tokens", "valid", "prefill_tokens_per_decode_step", "host_shared",
              "host_other_cores")
# not averaged over the baselines beside a speculative server: the worst of them
WORST = {"valid": min, "host_shared": max}


@dataclass
class Measured:
    server: str              # spec | baseline | baseline_sync
    alpha: Optional[float]   # the synthetic α the spec server ran at; None: as the model / a baseline
    round: int
    cap: Capture
    k: Optional[int] = None  # the spec server's draft length (None: a baseline)
    slot: int = 0            # its place in the round's order (baseline_beside pairs neighbours)

    def level(self, c: int) -> dict[str, float]:
        return {k: v for k in LEVEL_KEYS if (v := self.cap.latest(k).get(c)) is not None}


def paired_base(bases: list[Measured], spec: Measured, c: int, beside: bool) -> dict[str, float]:
    """The baseline figures at level c a speculative measurement is paired with: the round's
    baseline; with baseline_beside the mean of the baselines in the slots next to it (TPOT
    and every other figure; `valid` the lowest, `host_shared` the highest). {} when none
    measured the level."""
    near = [b for b in bases if abs(b.slot - spec.slot) == 1] if beside else bases[:1]
    figs = [f for b in near if (f := b.level(c))]
    if not figs:
        return {}
    out = {k: sum(f[k] for f in figs) / len(figs) for k in LEVEL_KEYS
           if k not in WORST and all(k in f for f in figs)}
    for k, worst in WORST.items():
        if any(k in f for f in figs):
            out[k] = worst(f.get(k, 0.0) for f in figs)
    return out


def _spread(xs: list[float]) -> dict[str, float]:
    return {"med": median(xs), "min": min(xs), "max": max(xs)} if xs else {}


def summarise(exp: SpecDecodeConfig, measured: list[Measured], out: Path,
              rec: Recorder) -> dict[str, float]:
    """points.csv (every server, α, round and level), results.txt/.csv and the per-point
    metrics (step = concurrency); returns the summary figures (round 1's spec_speedup)."""
    shown = {exp.step_of(lv): lv for lv in exp.sweep_levels()}  # step: level
    levels = list(shown)
    with open(out / "points.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["server", "k", "alpha", "round", "level", *LEVEL_KEYS, "slot"])
        for m in measured:
            for c in levels:
                fig = m.level(c)
                if fig:
                    w.writerow([m.server, "" if m.k is None else m.k,
                                "" if m.alpha is None else m.alpha, m.round, c,
                                *(fig.get(k, "") for k in LEVEL_KEYS), m.slot])
    by = {(m.server, m.k, m.alpha, m.round): m for m in measured}
    bases: dict[int, list[Measured]] = {}  # each round's baseline measurements
    for m in measured:
        if m.server == "baseline":
            bases.setdefault(m.round, []).append(m)
    rounds = sorted({m.round for m in measured})
    multi = bool(exp.draft_lengths)
    points = list(dict.fromkeys((m.k, m.alpha) for m in measured if m.server == "spec"))
    rows, summary = [], {}
    for k_, a in points:
        for c in levels:
            spec = {r: by[("spec", k_, a, r)].level(c) for r in rounds if ("spec", k_, a, r) in by}
            base = {r: f for r in rounds if ("spec", k_, a, r) in by
                    and (f := paired_base(bases.get(r, []), by[("spec", k_, a, r)], c,
                                          exp.baseline_beside))}
            sync = {r: by[("baseline_sync", None, None, r)].level(c) for r in rounds
                    if ("baseline_sync", None, None, r) in by}
            measured_in = [r for r in rounds if "tpot_ms_p50" in spec.get(r, {})]
            if not measured_in:
                continue
            # a round invalid or on a shared host at this level (its speculative server's or
            # the baselines' figures; one without host_shared predates it) is left out of the
            # point, as host_cpu.prefer_alone says
            figs_of = {r: [d[r] for d in (spec, base, sync) if r in d] for r in measured_in}
            kept, _ = prefer_alone(
                measured_in, lambda r: all(f.get("valid", 0.0) >= 1.0 for f in figs_of[r]),
                lambda r: any(f.get("host_shared", 0.0) for f in figs_of[r]))
            spec, base, sync = ({r: d[r] for r in kept if r in d} for d in (spec, base, sync))
            st = [f["tpot_ms_p50"] for f in spec.values() if "tpot_ms_p50" in f]
            bt = [f["tpot_ms_p50"] for f in base.values() if "tpot_ms_p50" in f]
            yt = [f["tpot_ms_p50"] for f in sync.values() if "tpot_ms_p50" in f]
            ratios = [base[r]["tpot_ms_p50"] / spec[r]["tpot_ms_p50"] for r in rounds
                      if "tpot_ms_p50" in spec.get(r, {}) and "tpot_ms_p50" in base.get(r, {})]
            tau = [f["mean_acceptance_length"] for f in spec.values() if "mean_acceptance_length" in f]
            steps = [f["tpot_ms_p50"] * f["mean_acceptance_length"] for f in spec.values()
                     if "mean_acceptance_length" in f and "tpot_ms_p50" in f]
            valid = min([f.get("valid", 0.0) for d in (spec, base, sync) for f in d.values()] or [0.0])
            shared = max([f.get("host_shared", 0.0) for d in (spec, base, sync) for f in d.values()])
            m: dict[str, float] = {"rounds": float(len(st)),
                                   "rounds_left_out": float(len(measured_in) - len(kept)),
                                   "host_shared": shared}
            for key, xs in (("spec_tpot_ms", st), ("base_tpot_ms", bt), ("sync_tpot_ms", yt),
                            ("speedup", ratios), ("step_ms", steps), ("tokens_per_step", tau)):
                m.update({f"{key}_{s}": v for s, v in _spread(xs).items()})
            if len(ratios) >= 2:
                m["speedup_ci_lo"], m["speedup_ci_hi"] = bootstrap_ci(ratios)
            m["valid"] = valid
            name = spec_point_name(a, k_ if multi else None)
            rec.log_metrics({f"{name}/{k}": v for k, v in m.items()}, step=c)
            rows.append([name, shown[c], len(st), m.get("base_tpot_ms_med"), m.get("sync_tpot_ms_med"),
                         m["spec_tpot_ms_med"], m["spec_tpot_ms_min"], m["spec_tpot_ms_max"],
                         m.get("speedup_med"), m.get("speedup_ci_lo"), m.get("speedup_ci_hi"),
                         m.get("tokens_per_step_med"), m.get("step_ms_med"), valid,
                         m["rounds_left_out"], shared])
    # round 1's single-stream comparison, as the phase has always logged it
    s1 = by.get(("spec", *points[0], 1)) if points else None
    b1 = next((b for b in bases.get(1, []) if s1 is None or not exp.baseline_beside
               or abs(b.slot - s1.slot) == 1), None)
    if s1 and b1:
        st1 = s1.cap.latest("single_stream_tpot_ms").get(None)
        bt1 = b1.cap.latest("single_stream_tpot_ms").get(None)
        if st1 and bt1:
            summary["spec_speedup"] = bt1 / st1
        for c in levels:
            sf, bf = s1.level(c), b1.level(c)
            if "tpot_ms_p50" in sf and "tpot_ms_p50" in bf:
                lm = {"level_spec_speedup": bf["tpot_ms_p50"] / sf["tpot_ms_p50"]}
                if sf.get("output_tok_s") and bf.get("output_tok_s"):
                    lm["level_throughput_gain"] = sf["output_tok_s"] / bf["output_tok_s"]
                rec.log_metrics(lm, step=c)
    if summary:
        rec.log_metrics(summary)
    f = "{:.3f}"
    cols = [tables.Column("accept", "{}", 12 if multi else 8),
            tables.Column("conc", "{}", 6) if exp.load == "closed" else tables.Column("rate/s", "{:g}", 8),
            tables.Column("n", "{}", 3), tables.Column("base", "{:.2f}", 8),
            tables.Column("base_sync", "{:.2f}", 10), tables.Column("spec", "{:.2f}", 8),
            tables.Column("spec_min", "{:.2f}", 9), tables.Column("spec_max", "{:.2f}", 9),
            tables.Column("speedup", f, 8), tables.Column("ci_lo", f, 7), tables.Column("ci_hi", f, 7),
            tables.Column("tok/step", "{:.2f}", 9), tables.Column("step_ms", "{:.2f}", 8),
            tables.Column("valid", "{:.0f}", 6), tables.Column("left_out", "{:.0f}", 9),
            tables.Column("shared", "{:.0f}", 7)]
    text = tables.write(out / "results", cols, rows,
                        f"spec_decode: {exp.method}, k = {', '.join(map(str, exp.k_values()))}, acceptance "
                        f"{exp.acceptance}; TPOT p50 ms, median over n rounds (spec min/max); "
                        "speedup = base/spec per round, median and bootstrap 95 % interval; "
                        "tok/step = 1 + accepted/drafts (server); step_ms = spec TPOT × tok/step; "
                        "left_out = rounds left out of the point (invalid, or the host shared "
                        "by other processes: host_shared); valid/shared = the kept rounds' worst")
    print(text, flush=True)
    return summary
