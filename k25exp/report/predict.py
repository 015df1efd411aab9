"""TPOT predicted at every macro level from the parts the reconciliation measured.

TPOT(c) predicted = micro ms of the collectives (burst_ms at tokens = c), the step's GEMMs
and MoE layers at c, + what no micro-benchmark covers, from the profiles: every other
category of the profile's trace rules (attention, norm/activation, memory, other,
convolution, all-to-all, other collectives, a user's own: reconcile.profile_rows) and idle,
the collectives' wait for the last rank (a
micro-benchmark starts every op after a barrier, so it times transport only) and the host
time between two steps (the trace's median gap between consecutive decode steps): linear in
c between profiled concurrencies, the nearest profile's value outside them (said so per
level). + the other requests' prefills a decode step shares: the macro level's
prefill_tokens_per_decode_step (counted from its requests' send clock: prompt tokens whose
prefill ended inside a request's decode, per decode step) × what one such token costs inside a
decode step. That cost is measured on the macro's own requests, without a profiler
(prefill_shared_us_per_token: the slope of their TPOTs on their shared prompt tokens,
k25exp.load.level_figures), so this part is measured, not predicted: the error is then the
parts' error on the level's decode-only TPOT (the fit's intercept, its own column). A level
without that fit (a run older than it) takes the profiles' prefill time per prompt token
(their prefill steps' time / their context tokens, interpolated as above), and says so: whole
prefill steps under the profiler, not the marginal cost inside a decode step, so it reads
high (one H200, Kimi rank: 48.6 µs at c = 256 against the macro's 29.8 µs). The profile
drives one wave of requests, so its decode steps hold no prefill; the macro's closed loop
replaces each finished request, and those prefills run inside the steps TPOT counts (at
c = 256 on one H200: a 38.2 ms decode step under a 43.6 ms TPOT).

On a CPU communicator whose ops return when done (gloo, shared memory: the budget takes the
burst's transport), the collectives are the burst timed inside the server's own TP workers
where the profiles timed it (server_burst_transport_ms, linear in c between profiled
concurrencies, held outside them): the same back-to-back ops, in the processes, threads and
pinning the server runs them in. The nccl_burst figure (processes of its own) stands beside
it; on vLLM's gloo path the two differed by up to ~50 % (docs/report.md). Without an
in-server burst the nccl_burst figure is used and the note says so.

Missing in means missing out: a part that a profile the level needs (the two around it, or
the nearest) did not measure leaves the level without a prediction and without an
error, and its note names the part; it is never counted as 0 ms. Additivity is assumed: the
parts run one after another. The profile's overlap_share says how far that is off, and the
uncovered parts carry the profiler's own slowdown, less what the profile measured of it: its
level sent without the profiler on the same server start (unprofiled_decode_only_tpot_ms)
gives the profiler's overhead per step (reconcile's profiler_overhead_ms), taken out of idle
(host time the profiler's callbacks add shows there, not in the kernels), never below 0.

The GEMMs and MoE layers are timed in-stream where the GEMM run has that figure (K calls back
to back in one CUDA graph ÷ K, as the server's graph runs them), else isolated; a level whose
parts were timed isolated says so. At world size 1 (the server ran on one rank) the
collectives and their wait are 0 ms, not missing: the section says so, and every level whose
other parts were measured is predicted.
"""

from __future__ import annotations

from typing import Optional

from k25exp.report import metrics as M
from k25exp.report.figures import Figure, Section, Table, missing, unique_runs
from k25exp.report.measured import ONE_RANK
from k25exp.report.reconcile import Micro, engine_tpot, profile_runs, shape_note, uncovered_parts
from k25exp.report.sources import Campaign


def predict(c: Campaign, per_c: dict[int, dict[str, float]], micro: Optional[Micro] = None,
            tpot: Optional[tuple[dict[int, float], str]] = None
            ) -> tuple[Section, dict[int, dict[str, float]]]:
    """TPOT predicted at every macro level; metrics per level (step = concurrency). `micro`
    and `tpot` as reconcile takes them (the report shares one of each)."""
    sec = Section("TPOT predicted at every concurrency from the parts")
    macro = c.closed_loop_macro()
    micro = micro or Micro(c)
    out: dict[int, dict[str, float]] = {}
    if not macro or not per_c:
        sec.figures.append(missing(M.TPOT_PRED_WORST, "needs a macro run and a profile" if macro
                                   else c.why_no_closed_loop_macro()))
        return sec, out
    # per part, its value at every profiled concurrency (None where that profile lacks it)
    from_profiles = uncovered_parts(per_c)
    keys = {**{cat: f"{cat}_profile_ms" for cat in from_profiles}, "wait": "comm_wait_ms",
            "between_steps": "between_steps_ms"}
    uncovered = {part: {k: m.get(key) for k, m in per_c.items()} for part, key in keys.items()}
    taken = _less_profiler_overhead(uncovered.get("idle", {}), per_c)
    rows = []
    tpots, tpot_src = tpot or engine_tpot(macro)
    client = macro.history("tpot_ms_p50")
    shared = macro.history("prefill_tokens_per_decode_step")
    per_token = {k: m.get("prefill_us_per_token") for k, m in per_c.items()}
    fitted = {k: (v, macro.history("prefill_fit_n").get(k))  # the macro's own marginal cost
              for k, v in macro.history("prefill_shared_us_per_token").items()}
    decode_only = macro.history("decode_only_tpot_ms")
    in_server = _in_server_burst(per_c, micro)
    if micro.one_rank:
        sec.notes.append(f"{ONE_RANK} (the server ran on one rank: run {micro.one_rank.short}): "
                         "the collectives and their wait count 0 ms at every level")
    if note := shape_note(profile_runs(c), macro):
        sec.notes.append(note)
    for level, tpot in sorted(tpots.items()):
        own = micro.at("comm", level)  # the nccl_burst figure: processes of its own
        parts = {"comm": own, "gemm": micro.at("gemm", level), "moe": micro.at("moe", level)}
        used = []
        if in_server:
            parts["comm"], how_srv = _lerp(in_server, level)
            used.append("collectives: in-server burst" + (f" {how_srv}" if how_srv else ""))
        elif micro.burst_key == "burst_transport_ms":
            used.append("collectives: nccl_burst (no profile timed the burst in the server's workers)")
        notes = used + [f"{k}: {micro.why.get(k, 'outside the measured range')}"
                        for k, v in parts.items() if v is None]
        isolated = [f"{k}: {micro.timing[(k, level)]}" for k in ("gemm", "moe")
                    if parts[k] is not None and micro.timing.get((k, level), "in-stream") != "in-stream"]
        if isolated:  # the isolated figure carries a fixed cost per call the graph does not
            notes.append("no in-stream figure, timed " + "; ".join(isolated))
        rest, held, absent = 0.0, set(), []
        for part, pts in uncovered.items():
            v, how = _lerp(pts, level)
            if v is None:  # never 0 ms: the level gets no prediction
                absent.append(part)
                continue
            rest += v
            if how:
                held.add(how)
        prefill, why_pf = _prefill_ms(shared.get(level), per_token, level, fitted.get(level))
        if absent:
            notes.append(f"missing: {', '.join(absent)} (not in the profile(s) this level needs)")
            rest = None
        if why_pf:
            notes.append(why_pf)
        if held:
            notes.append("uncovered parts " + ", ".join(sorted(held)))
        pred = None if rest is None or prefill is None or any(v is None for v in parts.values()) \
            else sum(parts.values()) + rest + prefill
        row = [level, tpot, client.get(level), decode_only.get(level), pred, parts["comm"],
               own, parts["gemm"], parts["moe"], rest, prefill]
        same = per_c.get(level, {}).get("profile_server_tpot_ms")  # the profile's server start
        err = err_same = None
        if pred is not None:
            err = (pred - tpot) / tpot * 100
            out[level] = {M.TPOT_PRED_MS: pred, M.TPOT_PRED_ERR: err}
            if same:
                err_same = (pred - same) / same * 100
                out[level][M.TPOT_PRED_ERR_SAME] = err_same
        rows.append(row + [err, err_same, "; ".join(notes)])
    sec.tables.append(Table("Predicted vs measured TPOT (ms)",
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
                            + (f"; {ONE_RANK}" if micro.one_rank else "")))
    if out:
        worst = max(out, key=lambda k: abs(out[k][M.TPOT_PRED_ERR]))
        sec.figures.append(Figure(M.TPOT_PRED_WORST, out[worst][M.TPOT_PRED_ERR],
                                  unique_runs([macro] + micro.runs_for("comm")[:1]
                                              + micro.runs_for("gemm")),
                                  f"at concurrency {worst}: predicted "
                                  f"{out[worst][M.TPOT_PRED_MS]:.3f} ms vs measured "
                                  f"{tpots[worst]:.3f} ms ({tpot_src})"))
        sec.plot = {"kind": "sweep", "x": sorted(out), "series": {
            f"measured TPOT ({tpot_src})": [tpots[k] for k in sorted(out)],
            "client TPOT p50": [client.get(k) for k in sorted(out)],
            "predicted": [out[k][M.TPOT_PRED_MS] for k in sorted(out)]},
            "xlabel": "concurrency", "ylabel": "ms", "title": "TPOT: predicted vs measured",
            "file": "tpot_predicted_vs_measured.png"}
    else:
        sec.figures.append(missing(M.TPOT_PRED_WORST, "no level had every part: " + "; ".join(
            sorted({r[-1] for r in rows if r[-1]}))[:400]))
    return sec, out


def _less_profiler_overhead(idle: dict[int, Optional[float]], per_c: dict[int, dict[str, float]]
                            ) -> dict[int, float]:
    """Takes the profiler's own overhead per step (reconcile's profiler_overhead_ms: the
    profiled step + gap − the same server start's decode-only TPOT without the profiler) out
    of each profile's idle, in place, never below 0: the profiler slows the host (its
    callbacks), which a step shows as time no op covers, not as longer kernels. Returns the
    ms taken per profiled concurrency."""
    taken = {}
    for k, v in idle.items():
        over = per_c[k].get("profiler_overhead_ms")
        if v is not None and over is not None and over > 0:
            taken[k] = min(v, over)
            idle[k] = v - taken[k]
    return taken


def _in_server_burst(per_c: dict[int, dict[str, float]], micro: Micro) -> dict[int, float]:
    """Per profiled concurrency, the step's collectives timed inside the server's own TP
    workers (ms, transport). Only where the budget takes the burst's transport (a CPU
    communicator whose ops return when done: measured.burst_key); {} elsewhere."""
    if micro.burst_key != "burst_transport_ms":
        return {}
    return {k: m["comm_server_burst_ms"] for k, m in per_c.items() if "comm_server_burst_ms" in m}


def _prefill_ms(tokens: Optional[float], per_token: dict[int, Optional[float]], level: int,
                fitted: Optional[tuple[float, Optional[float]]] = None
                ) -> tuple[Optional[float], str]:
    """The prefills a decode step of `level` shares, ms per step, and a note (module
    docstring); None (the level gets no prediction) when a figure it needs is missing.
    `fitted`: the macro level's own (prefill_shared_us_per_token, prefill_fit_n)."""
    if tokens is None:
        return None, ("missing: prefills shared (the macro run has no "
                      "prefill_tokens_per_decode_step: a run older than that figure)")
    if tokens == 0:
        return 0.0, ""
    known = {k: v for k, v in per_token.items() if v is not None}
    prof, how = _lerp(known, level) if known else (None, "")
    beside = f"; the profiles' prefill steps: {prof:.2f} µs" if prof is not None else ""
    if fitted is not None:
        us, n = fitted
        what = f"{us:.2f} µs (" if us >= 0 else f"0 µs (fit {us:.2f} µs: no cost above the noise; "
        return tokens * max(us, 0.0) / 1e3, (
            f"prefills shared: {tokens:.1f} prompt tokens per step × {what}measured: the "
            f"macro level's own requests, least squares over n = {n or 0:.0f}{beside})")
    if prof is None:
        return None, "missing: prefills shared (no profile of this campaign timed a prefill step)"
    return tokens * prof / 1e3, (f"prefills shared: {tokens:.1f} prompt tokens per step × "
                                 f"{prof:.2f} µs, the profiles' prefill steps (the macro run has "
                                 "no prefill_shared_us_per_token: whole prefill steps under the "
                                 "profiler, which read high)" + (f" ({how})" if how else ""))


def _lerp(points: dict[int, Optional[float]], c: int) -> tuple[Optional[float], str]:
    """The part at concurrency c from the profiles around it (linear), or the nearest one
    outside them; None when a profile it needs has no value (the part is missing there)."""
    xs = sorted(points)
    if not xs:
        return None, ""
    if c <= xs[0]:
        return points[xs[0]], "" if c == xs[0] else f"held at c={xs[0]}"
    if c >= xs[-1]:
        return points[xs[-1]], "" if c == xs[-1] else f"held at c={xs[-1]}"
    hi = next(x for x in xs if x >= c)
    if hi == c:
        return points[c], ""
    lo = max(x for x in xs if x < c)
    if points[lo] is None or points[hi] is None:
        return None, ""
    f = (c - lo) / (hi - lo)
    return points[lo] + f * (points[hi] - points[lo]), ""
