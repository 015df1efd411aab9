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

A campaign of several request shapes (a context sweep) prices each level's uncovered parts
and shared prefills elsewhere (Inputs.priced, k25exp.report.context_model: a fit over every
profiled (context, c) point, the other levels' prefill cost) in place of the profiles around
its c; the rest of the sum is as above.

The model is a pure function of what was measured (`predict_levels(Inputs)`: per level, its
parts, the prediction and its errors, and notes on how each part was had); reading the runs
and laying the result out as the report's table, caption and plot is k25exp.report.predict's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

# The profiles' parts besides their categories' rows: the collectives' wait for the last rank
# and the host's gap between two decode steps (reconcile's metric of each).
WAIT, BETWEEN_STEPS = "wait", "between_steps"
IN_STREAM = "in-stream"


@dataclass(frozen=True)
class MicroParts:
    """The micro-benchmarks at one macro level, ms per decode step (None: not measured there)."""
    burst_ms: Optional[float]  # the step's collectives, nccl_burst (processes of its own)
    gemm_ms: Optional[float]   # the step's GEMMs other than the experts'
    moe_ms: Optional[float]    # the MoE layers
    # why a part ("comm", "gemm", "moe") is None, where the benchmarks say
    why: dict[str, str] = field(default_factory=dict)
    # how "gemm" / "moe" was timed: "in-stream", "isolated" or a mix (absent: in-stream)
    timing: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Profiled:
    """What one profile measured at its concurrency (reconcile's metrics), ms per decode step;
    None: the profile did not measure it."""
    # every row no micro-benchmark stands in for (attention, idle, ...), in row order, then
    # WAIT and BETWEEN_STEPS
    parts: dict[str, Optional[float]]
    profiler_overhead_ms: Optional[float] = None  # profiled step + gap − decode-only TPOT without it
    server_burst_ms: Optional[float] = None       # the burst timed in the server's own TP workers
    prefill_us_per_token: Optional[float] = None  # its prefill steps' time per prompt token
    server_tpot_ms: Optional[float] = None        # its server start's TPOT without the profiler


@dataclass(frozen=True)
class Priced:
    """A level's uncovered parts and shared prefills priced elsewhere, in place of the profiles
    around its concurrency (a campaign of several request shapes: k25exp.report.context_model)."""
    parts: dict[str, Optional[float]]  # each uncovered part, ms per step (None: missing)
    how: str                           # how they were had, for the level's note
    prefill_ms: Optional[float]        # the prefills shared, ms per step (None: missing)
    prefill_note: str                  # how, or why missing


@dataclass(frozen=True)
class Inputs:
    """Everything the model reads, per macro level or profiled concurrency."""
    tpot_ms: dict[int, float]          # the macro's measured TPOT per level (the engine's)
    micro: dict[int, MicroParts]       # per macro level
    profiles: dict[int, Profiled]      # per profiled concurrency
    # the budget takes the burst's transport (a CPU communicator whose ops return when done):
    # then the burst timed in the server's workers stands for the collectives where profiled
    burst_is_transport: bool = False
    prefill_tokens: dict[int, float] = field(default_factory=dict)  # prefill_tokens_per_decode_step
    # the macro level's own marginal cost: (prefill_shared_us_per_token, prefill_fit_n)
    prefill_fit: dict[int, tuple[float, Optional[float]]] = field(default_factory=dict)
    priced: dict[int, Priced] = field(default_factory=dict)  # per level: replaces the above


@dataclass(frozen=True)
class LevelPrediction:
    """One macro level: its parts (ms per decode step), their sum and its errors."""
    level: int
    measured_ms: float              # the macro's TPOT
    comm_ms: Optional[float]        # the collectives as predicted: in-server burst, else burst_ms
    burst_ms: Optional[float]       # the nccl_burst figure, beside it
    gemm_ms: Optional[float]
    moe_ms: Optional[float]
    uncovered_ms: Optional[float]   # Σ of the profiles' parts; None when one is missing
    prefill_ms: Optional[float]     # the other requests' prefills a decode step shares
    predicted_ms: Optional[float]   # None when any part is missing (never counted as 0 ms)
    error_pct: Optional[float]      # against measured_ms
    error_vs_profile_server_pct: Optional[float]  # against the profile's server start, where profiled
    notes: tuple[str, ...]          # how each part was had, what is missing


@dataclass(frozen=True)
class Prediction:
    """Every macro level's prediction, and what the model took from the profiles for all."""
    levels: tuple[LevelPrediction, ...]  # by concurrency
    in_server: dict[int, float]          # per profiled concurrency, the in-server burst used ({}: none)
    overhead_taken: dict[int, float]     # per profiled concurrency, the ms taken out of idle


def predict_levels(inp: Inputs) -> Prediction:
    """TPOT predicted at every level of inp.tpot_ms from its parts (module docstring)."""
    if missing := sorted(set(inp.tpot_ms) - set(inp.micro)):
        raise ValueError(f"micro: no parts for macro level(s) {missing}: expected one "
                         "MicroParts per level of tpot_ms")
    names: list[str] = []  # the profiles' parts, in their order, each once
    for p in inp.profiles.values():
        names += [n for n in p.parts if n not in names]
    uncovered = {n: {k: p.parts.get(n) for k, p in inp.profiles.items()} for n in names}
    taken = _less_profiler_overhead(uncovered.get("idle", {}), inp.profiles)
    in_server = ({k: p.server_burst_ms for k, p in inp.profiles.items()
                  if p.server_burst_ms is not None} if inp.burst_is_transport else {})
    per_token = {k: p.prefill_us_per_token for k, p in inp.profiles.items()}
    levels = []
    for level, tpot in sorted(inp.tpot_ms.items()):
        mi = inp.micro[level]
        parts = {"comm": mi.burst_ms, "gemm": mi.gemm_ms, "moe": mi.moe_ms}
        used = []
        if in_server:
            parts["comm"], how_srv = _lerp(in_server, level)
            used.append("collectives: in-server burst" + (f" {how_srv}" if how_srv else ""))
        elif inp.burst_is_transport:
            used.append("collectives: nccl_burst (no profile timed the burst in the server's workers)")
        notes = used + [f"{k}: {mi.why.get(k, 'outside the measured range')}"
                        for k, v in parts.items() if v is None]
        isolated = [f"{k}: {mi.timing[k]}" for k in ("gemm", "moe")
                    if parts[k] is not None and mi.timing.get(k, IN_STREAM) != IN_STREAM]
        if isolated:  # the isolated figure carries a fixed cost per call the graph does not
            notes.append("no in-stream figure, timed " + "; ".join(isolated))
        rest: Optional[float] = 0.0
        held, absent = set(), []
        pr = inp.priced.get(level)
        for part, pts in (pr.parts if pr else uncovered).items():
            v, how = (pts, "") if pr else _lerp(pts, level)
            if v is None:  # never 0 ms: the level gets no prediction
                absent.append(part)
                continue
            rest += v
            if how:
                held.add(how)
        if pr:
            held.add(pr.how)
            prefill, why_pf = pr.prefill_ms, pr.prefill_note
        else:
            prefill, why_pf = _prefill_ms(inp.prefill_tokens.get(level), per_token, level,
                                          inp.prefill_fit.get(level))
        if absent:
            notes.append(f"missing: {', '.join(absent)} (not in the profile(s) this level needs)")
            rest = None
        if why_pf:
            notes.append(why_pf)
        if held:
            notes.append("uncovered parts " + ", ".join(sorted(held)))
        pred = None if rest is None or prefill is None or any(v is None for v in parts.values()) \
            else sum(parts.values()) + rest + prefill
        same = inp.profiles[level].server_tpot_ms if level in inp.profiles else None
        err = err_same = None
        if pred is not None:
            err = (pred - tpot) / tpot * 100
            if same:
                err_same = (pred - same) / same * 100
        levels.append(LevelPrediction(level, tpot, parts["comm"], mi.burst_ms, parts["gemm"],
                                      parts["moe"], rest, prefill, pred, err, err_same,
                                      tuple(notes)))
    return Prediction(tuple(levels), in_server, taken)


def _less_profiler_overhead(idle: dict[int, Optional[float]], profiles: dict[int, Profiled]
                            ) -> dict[int, float]:
    """Takes the profiler's own overhead per step (reconcile's profiler_overhead_ms: the
    profiled step + gap − the same server start's decode-only TPOT without the profiler) out
    of each profile's idle, in place, never below 0: the profiler slows the host (its
    callbacks), which a step shows as time no op covers, not as longer kernels. Returns the
    ms taken per profiled concurrency."""
    taken = {}
    for k, v in idle.items():
        over = profiles[k].profiler_overhead_ms
        if v is not None and over is not None and over > 0:
            taken[k] = min(v, over)
            idle[k] = v - taken[k]
    return taken


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
