"""The report's section on TPOT predicted at every macro level: the measured inputs read from
the campaign's runs, the model (k25exp.report.tpot_model, whose docstring says what it adds
up) run on them, and its result laid out as a table, a caption, one figure and a plot."""

from __future__ import annotations

from typing import Optional

from k25exp.report import metrics as M
from k25exp.report.figures import Figure, Section, Table, missing, unique_runs
from k25exp.report.measured import ONE_RANK
from k25exp.report.reconcile import Micro, engine_tpot, profile_runs, shape_note, uncovered_parts
from k25exp.report.sources import Campaign
from k25exp.report.tpot_model import (BETWEEN_STEPS, WAIT, Inputs, MicroParts, Prediction, Profiled,
                                      predict_levels)
from k25exp.tracking.read import RunView

TRANSPORT = "burst_transport_ms"  # the burst key of a CPU communicator (measured.burst_key)


def predict(c: Campaign, per_c: dict[int, dict[str, float]], micro: Optional[Micro] = None,
            tpot: Optional[tuple[dict[int, float], str]] = None
            ) -> tuple[Section, dict[int, dict[str, float]]]:
    """TPOT predicted at every macro level; metrics per level (step = concurrency). `micro`
    and `tpot` as reconcile takes them (the report shares one of each)."""
    sec = Section("TPOT predicted at every concurrency from the parts")
    macro = c.closed_loop_macro()
    micro = micro or Micro(c)
    if not macro or not per_c:
        sec.figures.append(missing(M.TPOT_PRED_WORST, "needs a macro run and a profile" if macro
                                   else c.why_no_closed_loop_macro()))
        return sec, {}
    tpots, tpot_src = tpot or engine_tpot(macro)
    model = predict_levels(model_inputs(macro, per_c, micro, tpots))
    if micro.one_rank:
        sec.notes.append(f"{ONE_RANK} (the server ran on one rank: run {micro.one_rank.short}): "
                         "the collectives and their wait count 0 ms at every level")
    if note := shape_note(profile_runs(c, macro), macro):
        sec.notes.append(note)
    out = level_metrics(model)
    sec.tables.append(_table(model, macro, tpot_src, uncovered_parts(per_c), micro))
    if out:
        worst = max(out, key=lambda k: abs(out[k][M.TPOT_PRED_ERR]))
        sec.figures.append(Figure(M.TPOT_PRED_WORST, out[worst][M.TPOT_PRED_ERR],
                                  unique_runs([macro] + micro.runs_for("comm")[:1]
                                              + micro.runs_for("gemm")),
                                  f"at concurrency {worst}: predicted "
                                  f"{out[worst][M.TPOT_PRED_MS]:.3f} ms vs measured "
                                  f"{tpots[worst]:.3f} ms ({tpot_src})"))
        sec.plot = _plot(out, tpots, macro.history("tpot_ms_p50"), tpot_src)
    else:
        sec.figures.append(missing(M.TPOT_PRED_WORST, "no level had every part: " + "; ".join(
            sorted({"; ".join(lv.notes) for lv in model.levels if lv.notes}))[:400]))
    return sec, out


def model_inputs(macro: RunView, per_c: dict[int, dict[str, float]], micro: Micro,
           tpots: dict[int, float]) -> Inputs:
    """The model's inputs at every level of `tpots`: the micro-benchmarks at each (asked in
    level order: Micro records why a part is missing as it is asked), reconcile's metrics per
    profiled concurrency and the macro run's own prefill figures."""
    profiles = profiled(per_c)
    fit_n = macro.history("prefill_fit_n")
    return Inputs(tpots, {level: _micro_parts(micro, level) for level in sorted(tpots)}, profiles,
                  micro.burst_key == TRANSPORT, macro.history("prefill_tokens_per_decode_step"),
                  {k: (v, fit_n.get(k)) for k, v in macro.history("prefill_shared_us_per_token").items()})


def profiled(per_c: dict[int, dict[str, float]]) -> dict[int, Profiled]:
    """What the model reads of each profile: reconcile's metrics per profiled concurrency."""
    names = uncovered_parts(per_c)
    keys = {**{cat: f"{cat}_profile_ms" for cat in names}, WAIT: "comm_wait_ms",
            BETWEEN_STEPS: "between_steps_ms"}
    return {k: Profiled({part: m.get(key) for part, key in keys.items()},
                        m.get("profiler_overhead_ms"), m.get("comm_server_burst_ms"),
                        m.get("prefill_us_per_token"), m.get("profile_server_tpot_ms"))
            for k, m in per_c.items()}


def _micro_parts(micro: Micro, level: int) -> MicroParts:
    got = {part: micro.at(part, level) for part in ("comm", "gemm", "moe")}
    return MicroParts(got["comm"], got["gemm"], got["moe"],
                      {p: micro.why[p] for p, v in got.items() if v is None and p in micro.why},
                      {p: micro.timing[(p, level)] for p in ("gemm", "moe") if (p, level) in micro.timing})


def level_metrics(model: Prediction) -> dict[int, dict[str, float]]:
    """The metrics per predicted level: predicted ms, error %, and the error against the
    profile's own server start where there is one."""
    out: dict[int, dict[str, float]] = {}
    for lv in model.levels:
        if lv.predicted_ms is not None:
            out[lv.level] = {M.TPOT_PRED_MS: lv.predicted_ms, M.TPOT_PRED_ERR: lv.error_pct}
            if lv.error_vs_profile_server_pct is not None:
                out[lv.level][M.TPOT_PRED_ERR_SAME] = lv.error_vs_profile_server_pct
    return out


def _table(model: Prediction, macro: RunView, tpot_src: str, from_profiles: list[str],
           micro: Micro) -> Table:
    client = macro.history("tpot_ms_p50")
    decode_only = macro.history("decode_only_tpot_ms")
    rows = [[lv.level, lv.measured_ms, client.get(lv.level), decode_only.get(lv.level),
             lv.predicted_ms, lv.comm_ms, lv.burst_ms, lv.gemm_ms, lv.moe_ms, lv.uncovered_ms,
             lv.prefill_ms, lv.error_pct, lv.error_vs_profile_server_pct, "; ".join(lv.notes)]
            for lv in model.levels]
    in_server, taken = model.in_server, model.overhead_taken
    return Table("Predicted vs measured TPOT (ms)",
                 ["concurrency", f"TPOT ({tpot_src})", "client TPOT p50",
                  "decode-only TPOT (macro fit)", "predicted",
                  "collectives", "nccl_burst", "GEMMs", "MoE", "uncovered (profile)",
                  "prefills shared", "error %", "error vs profile's server %", "note"],
                 rows,
                 "predicted = collectives burst + GEMMs + MoE layers (micro: in-stream "
                 "where timed so, else isolated) + " + ", ".join(from_profiles)
                 + ", the collectives' wait and the host time between steps "
                 "from the profiles + prefills shared (the macro level's prompt tokens "
                 "prefilled per decode step × their marginal cost, measured on the "
                 "macro's own requests: the slope of their TPOTs on their shared "
                 "prompt tokens, whose intercept is the decode-only TPOT; without "
                 "that fit, the profiles' prefill µs per token, said so per level); "
                 "collectives: " + ("the burst timed in the server's own TP workers "
                                    f"(profiles' server_burst_transport_ms, {len(in_server)} "
                                    "profiled level(s)), the nccl_burst figure beside it; "
                                    if in_server else "the nccl_burst figure; ")
                 + "parts assumed additive; error vs profile's server: against the "
                 "TPOT of the profile's own server start without the profiler "
                 "(profiled levels: the parts' model without the spread between "
                 "server starts)"
                 + ("; idle less the profiler's own overhead per step (profiled "
                    "step + gap − the profile's server's decode-only TPOT without "
                    "it), ms: " + ", ".join(f"c={k} {v:.3f}" for k, v in taken.items())
                    if taken else "; the uncovered parts carry the profiler's own "
                    "overhead (no profile measured a positive one against its level "
                    "without the profiler)")
                 + (f"; {ONE_RANK}" if micro.one_rank else ""))


def _plot(out: dict[int, dict[str, float]], tpots: dict[int, float], client: dict[int, float],
          tpot_src: str) -> dict:
    xs = sorted(out)
    return {"kind": "sweep", "x": xs, "series": {
        f"measured TPOT ({tpot_src})": [tpots[k] for k in xs],
        "client TPOT p50": [client.get(k) for k in xs],
        "predicted": [out[k][M.TPOT_PRED_MS] for k in xs]},
        "xlabel": "concurrency", "ylabel": "ms", "title": "TPOT: predicted vs measured",
        "file": "tpot_predicted_vs_measured.png"}
