"""The report's section on TPOT across context and concurrency: a campaign whose closed-loop
macro runs sent requests of several shapes (a sweep of experiment.input_tokens), each
(shape, concurrency) point predicted from its parts and set against what it measured.

The campaign's closed-loop macro runs and profile runs are grouped by request shape
(experiment.input_tokens, experiment.output_tokens: a length distribution's centres); per
shape the newest macro run and the newest profile per concurrency. At every level a macro run
measured: the collectives, GEMMs and MoE layers from the micro-benchmarks at c, as
k25exp.report.tpot_model adds them (they depend on c, not on the context; where the
collectives are the burst timed in the server's workers, the median over every shape's
profile at that c, each one server start); the uncovered parts
from a fit over every profiled (context, c) point, the prefills shared priced from the other
levels of the shape (k25exp.report.context_model says how, and why). The level's context is
its requests' measured mean prompt (input_len_mean) + half their mean output; a profile's,
its experiment.input_tokens + output_tokens / 2. Errors: the prediction against the engine's
TPOT (server_tpot_ms_mean, else the client's p50), and the parts without the prefills against
the level's decode-only TPOT (the intercept of its own prefill fit, decode_only_tpot_ms).
A campaign of one shape has no such section (None): the report is as before.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from k25exp.report import context_model as CM
from k25exp.report import metrics as M
from k25exp.report.figures import Figure, Section, Table, missing, unique_runs
from k25exp.report.predict import model_inputs, profiled as profiled_parts
from k25exp.report.reconcile import Micro, engine_tpot, profile_metrics, shape_of
from k25exp.report.sources import Campaign
from k25exp.report.tpot_model import LevelPrediction, Profiled, predict_levels
from k25exp.stats import median
from k25exp.tracking.read import RunView

Shape = tuple[int, int]


def shape_key(shape: Shape) -> str:
    """The metric suffix of a shape: in512_out64."""
    return f"in{shape[0]}_out{shape[1]}"


def macro_by_shape(c: Campaign) -> dict[Shape, RunView]:
    """The newest closed-loop macro run per request shape (Campaign.closed_loop_macro's rule
    within each shape)."""
    out: dict[Shape, RunView] = {}
    shapes = {s for r in c.of("macro", None) if (s := shape_of(r))}
    for s in sorted(shapes):
        r = c.closed_loop_macro(lambda r, s=s: shape_of(r) == s)
        if r is not None and shape_of(r) == s:
            out[s] = r
    return out


def profiles_by_shape(c: Campaign) -> dict[Shape, dict[int, RunView]]:
    """The newest finished profile run per (shape, concurrency)."""
    out: dict[Shape, dict[int, RunView]] = {}
    for r in c.of("profile"):  # newest first
        s, k = shape_of(r), r.param("experiment.concurrency", int)
        if s is not None and k is not None and "decode_step_ms" in r.metrics:
            out.setdefault(s, {}).setdefault(k, r)
    return out


@dataclasses.dataclass
class Point:
    """One measured (shape, concurrency) point and its prediction."""
    shape: Shape
    ctx: float
    level: LevelPrediction
    tok_s: Optional[float]
    decode_only: Optional[float]
    own_slope: Optional[float]      # the level's own prefill_shared_us_per_token (not used)
    uncovered_how: str
    prefill_how: str
    valid: Optional[float] = None   # the macro level's `valid` (0: flagged, its why in the run)

    @property
    def parts_err(self) -> Optional[float]:
        """(predicted − prefills shared − decode-only TPOT) / decode-only TPOT, %."""
        lv = self.level
        if lv.predicted_ms is None or lv.prefill_ms is None or not self.decode_only:
            return None
        return (lv.predicted_ms - lv.prefill_ms - self.decode_only) / self.decode_only * 100


def context_budget(c: Campaign, micro: Micro
                   ) -> tuple[Optional[Section], dict[str, dict[int, float]]]:
    """The section, and its metrics by key ({step = concurrency: value}); (None, {}) for a
    campaign whose macro runs sent one request shape."""
    macros = macro_by_shape(c)
    if len(macros) < 2:
        return None, {}
    sec = Section("TPOT across context and concurrency")
    profs = profiles_by_shape(c)
    tpots = {s: engine_tpot(r) for s, r in macros.items()}
    per_c = {s: {k: profile_metrics(p, k, micro, tpots[s][0].get(k) if s in tpots else None)[1]
                 for k, p in ps.items()} for s, ps in profs.items()}
    inputs = {s: model_inputs(macros[s], per_c.get(s, {}), micro, tpots[s][0]) for s in macros}
    profiled = {s: profiled_parts(m) for s, m in per_c.items()}
    unc = CM.Uncovered({(CM.context_of(*s), k): _less_overhead(p)
                        for s, ps in profiled.items() for k, p in ps.items()})
    bursts = _pooled_bursts(profiled)
    burst_at = {k: median(v) for k, v in bursts.items()}
    points: list[Point] = []
    for s, macro in macros.items():
        inp = dataclasses.replace(inputs[s], profiles=_with_bursts(inputs[s].profiles, burst_at))
        ctx = _level_contexts(macro, s)
        slopes = {k: (v, inp.prefill_fit[k][1]) for k, v in
                  macro.history("prefill_shared_us_per_token").items()}
        pf_steps = {k: p.prefill_us_per_token for k, p in profiled.get(s, {}).items()}
        priced, how = {}, {}
        for level in inp.tpot_ms:
            parts, u_how = unc.at(level, ctx[level])
            pf = CM.prefill_priced(level, inp.prefill_tokens.get(level), slopes, pf_steps)
            priced[level] = CM.priced(parts, u_how, pf)
            how[level] = (u_how, pf[1])
        model = predict_levels(dataclasses.replace(inp, priced=priced))
        tok_s = macro.history("output_tok_s")
        decode_only = macro.history("decode_only_tpot_ms")
        valid = macro.history("valid")
        for lv in model.levels:
            points.append(Point(s, ctx[lv.level], lv, tok_s.get(lv.level),
                                decode_only.get(lv.level), slopes.get(lv.level, (None,))[0],
                                *how[lv.level], valid.get(lv.level)))
    src = {t[1] for t in tpots.values()}
    sec.tables += [_grid(points, "TPOT (ms): measured / predicted (error %)", _tpot_cell),
                   _grid(points, "output tok/s (measured)", lambda p: p.tok_s),
                   _table(points, "; ".join(sorted(src))), _fit_table(unc)]
    runs = unique_runs(list(macros.values()) + [p for ps in profs.values() for p in ps.values()]
                       + micro.runs_for("comm")[:1] + micro.runs_for("gemm"))
    out = _metrics(points)
    done = [p for p in points if p.level.error_pct is not None]
    if done:
        worst = max(done, key=lambda p: abs(p.level.error_pct))
        sec.figures.append(Figure(M.TPOT_CTX_PRED_WORST, worst.level.error_pct, runs,
                                  f"at {_label(worst.shape)}, c = {worst.level.level}: predicted "
                                  f"{worst.level.predicted_ms:.3f} ms vs measured "
                                  f"{worst.level.measured_ms:.3f} ms, of {len(done)} points"
                                  + _invalid_note(done)))
        sec.plot = _plot(points)
    else:
        sec.figures.append(missing(M.TPOT_CTX_PRED_WORST, "no point had every part: " + "; ".join(
            sorted({"; ".join(p.level.notes) for p in points if p.level.notes}))[:400]))
    parts = [p for p in points if p.parts_err is not None]
    if parts:
        worst = max(parts, key=lambda p: abs(p.parts_err))
        sec.figures.append(Figure(M.TPOT_CTX_PARTS_WORST, worst.parts_err, runs,
                                  f"at {_label(worst.shape)}, c = {worst.level.level}: the parts "
                                  "without the prefills shared against the level's decode-only "
                                  f"TPOT {worst.decode_only:.3f} ms, of {len(parts)} points"))
    else:
        sec.figures.append(missing(M.TPOT_CTX_PARTS_WORST, "no point had a prediction and its "
                                   "decode-only TPOT (the macro run's decode_only_tpot_ms)"))
    if bursts and any(inp.burst_is_transport for inp in inputs.values()):
        sec.notes.append(_bursts_note(bursts, burst_at))
    if len(unc.contexts) == 1:
        sec.notes.append(f"the profiles hold one context ({unc.contexts[0]:g} tokens): the "
                         "uncovered parts are interpolated in c there and held at that context "
                         "for the other shapes (profile each shape: profile:experiment."
                         "input_tokens=a,b,c)")
    return sec, out


def _less_overhead(p: Profiled) -> dict[str, Optional[float]]:
    """The profile's uncovered parts, idle less its profiler's overhead per step, never below
    0 (as k25exp.report.tpot_model takes it out)."""
    parts = dict(p.parts)
    over, idle = p.profiler_overhead_ms, parts.get("idle")
    if idle is not None and over is not None and over > 0:
        parts["idle"] = idle - min(idle, over)
    return parts


def _pooled_bursts(profiled: dict[Shape, dict[int, Profiled]]) -> dict[int, list[float]]:
    """Per profiled c, the in-server bursts every shape's profile timed, sorted. The burst's
    messages depend on c alone, not on the context, so each profile's server start is one
    more sample of the same figure: on gloo one start's burst moved 46 % from another's
    (13.7 → 20.0 ms at c = 1, docs/report.md), and a point priced with its own start's burst
    alone carried that whole difference."""
    by_c: dict[int, list[float]] = {}
    for ps in profiled.values():
        for k, p in ps.items():
            if p.server_burst_ms is not None:
                by_c.setdefault(k, []).append(p.server_burst_ms)
    return {k: sorted(v) for k, v in by_c.items()}


def _with_bursts(own: dict[int, Profiled], burst_at: dict[int, float]) -> dict[int, Profiled]:
    """A shape's profiles with the in-server burst at each c the median of every shape's
    (`burst_at`); a c only other shapes profiled is added with the burst alone (no parts: the
    uncovered parts are priced by the fit)."""
    out = {k: dataclasses.replace(p, server_burst_ms=burst_at[k]) if k in burst_at else p
           for k, p in own.items()}
    for k, v in burst_at.items():
        out.setdefault(k, Profiled({}, server_burst_ms=v))
    return out


def _bursts_note(bursts: dict[int, list[float]], burst_at: dict[int, float]) -> str:
    """How the collectives were had, with the spread between server starts."""
    each = "; ".join(f"c = {k}: {burst_at[k]:.3f} ms, n = {len(v)}"
                     + (f" ({v[0]:.3f}–{v[-1]:.3f})" if len(v) > 1 else "")
                     for k, v in sorted(bursts.items()))
    return ("collectives: the in-server burst at each profiled c is the median over every "
            "shape's profile (the messages depend on c, not on the context; each profile is "
            f"one server start, min–max beside): {each}")


def _level_contexts(macro: RunView, shape: Shape) -> dict[int, float]:
    """Per level, the mean context its decode steps held: its requests' measured mean prompt
    and output where logged, else the shape's."""
    n_in, n_out = macro.history("input_len_mean"), macro.history("output_len_mean")
    levels = set(engine_tpot(macro)[0])
    return {k: CM.context_of(n_in.get(k, shape[0]), n_out.get(k, shape[1])) for k in levels}


def _invalid_note(points: list[Point]) -> str:
    """'; N flagged invalid by their macro level: …' (the engine's TPOT they are judged on
    still stands; the flag says the client's view of the level is not to be trusted), or ''."""
    bad = [p for p in points if p.valid == 0]
    if not bad:
        return ""
    return (f"; {len(bad)} flagged invalid by their macro level (the run's why column): "
            + ", ".join(f"{_label(p.shape)} c = {p.level.level}" for p in bad))


def _label(shape: Shape) -> str:
    return f"{shape[0]} / {shape[1]} tokens"


def _tpot_cell(p: Point) -> str:
    lv = p.level
    pred = "missing" if lv.predicted_ms is None else f"{lv.predicted_ms:.3f}"
    err = "" if lv.error_pct is None else f" ({lv.error_pct:+.1f} %)"
    return f"{lv.measured_ms:.3f} / {pred}{err}" + (" invalid" if p.valid == 0 else "")


def _grid(points: list[Point], title: str, cell) -> Table:
    """Shapes down, concurrencies across."""
    cs = sorted({p.level.level for p in points})
    shapes = sorted({p.shape for p in points})
    at = {(p.shape, p.level.level): p for p in points}
    rows = [[_label(s)] + [cell(at[(s, k)]) if (s, k) in at else None for k in cs] for s in shapes]
    return Table(title, ["prompt / output tokens"] + [f"c = {k}" for k in cs], rows)


def _table(points: list[Point], tpot_src: str) -> Table:
    rows = [[_label(p.shape), p.ctx, p.level.level, p.level.measured_ms, p.tok_s,
             p.level.predicted_ms, p.level.error_pct, p.decode_only,
             None if p.level.predicted_ms is None or p.level.prefill_ms is None
             else p.level.predicted_ms - p.level.prefill_ms, p.parts_err,
             p.level.comm_ms, p.level.gemm_ms, p.level.moe_ms, p.level.uncovered_ms,
             p.uncovered_how, p.level.prefill_ms, p.prefill_how, p.own_slope,
             None if p.valid is None else ("yes" if p.valid else "no"),
             "; ".join(p.level.notes)]
            for p in sorted(points, key=lambda p: (p.shape, p.level.level))]
    return Table("Every (context, concurrency) point: predicted vs measured TPOT (ms)",
                 ["prompt / output tokens", "context per step (tokens)", "concurrency",
                  f"TPOT ({tpot_src})", "output tok/s", "predicted", "error %",
                  "decode-only TPOT (macro fit)", "parts (predicted − prefills)",
                  "parts vs decode-only %", "collectives", "GEMMs", "MoE", "uncovered",
                  "uncovered: how", "prefills shared", "prefills: priced from",
                  "the level's own prefill µs/token (not used)", "valid (macro level)", "note"],
                 rows,
                 "predicted = collectives + GEMMs + MoE layers at c (micro-benchmarks) + the "
                 "uncovered parts at (c, context) (k25exp.report.context_model: a fit over every "
                 "profiled point, or interpolated in c where the profiles hold one context) + "
                 "prefills shared (the level's own prompt tokens per decode step × a cost per "
                 "token from the other levels of its shape, else the profiles' prefill steps); "
                 "context per step = mean prompt + mean output / 2; error % against the "
                 "engine's TPOT, parts vs decode-only % = the prediction without the prefills "
                 "against the intercept of the level's own prefill fit; valid: the macro "
                 "level's flag (client lag, delivery stall, errors: its results table says "
                 "which), 'invalid' in the grid")


def _fit_table(unc: CM.Uncovered) -> Table:
    pts = sorted(unc.points)
    rows = []
    for part in unc.parts:
        f = unc.fits.get(part)
        coef = dict(zip(f.columns, f.coef)) if f else {}
        rows.append([part, coef.get("1"), coef.get("c"), coef.get("c·ctx"),
                     f.n if f else None, f.residual_max if f else None]
                    + [unc.points[k].get(part) for k in pts])
    how = ("least squares over the profiled points" if unc.fits else
           "one profiled context: interpolated in c (no fit)")
    return Table("Uncovered parts at the profiled points (ms per step) and their fit",
                 ["part", "a (ms)", "b (ms per sequence)", "e (ms per sequence·token)",
                  "points", "max |residual| (ms)"]
                 + [f"ctx {x:g}, c = {k}" for x, k in pts], rows,
                 f"u(c, ctx) = a + b·c + e·c·ctx, {how}; a column the points do not span is "
                 "left out (empty); idle is less the profiler's own overhead per step")


def _metrics(points: list[Point]) -> dict[str, dict[int, float]]:
    out: dict[str, dict[int, float]] = {}
    for p in points:
        lv, key = p.level, shape_key(p.shape)
        if lv.predicted_ms is None:
            continue
        out.setdefault(f"{M.CTX}tpot_pred_ms.{key}", {})[lv.level] = lv.predicted_ms
        out.setdefault(f"{M.CTX}tpot_pred_err_pct.{key}", {})[lv.level] = lv.error_pct
        if p.parts_err is not None:
            out.setdefault(f"{M.CTX}tpot_parts_err_pct.{key}", {})[lv.level] = p.parts_err
    return out


def _plot(points: list[Point]) -> dict:
    xs = sorted({p.level.level for p in points})
    series: dict[str, list[Optional[float]]] = {}
    for s in sorted({p.shape for p in points}):
        at = {p.level.level: p.level for p in points if p.shape == s}
        series[f"measured, {s[0]} in"] = [at[k].measured_ms if k in at else None for k in xs]
        series[f"predicted, {s[0]} in"] = [at[k].predicted_ms if k in at else None for k in xs]
    return {"kind": "sweep", "x": xs, "series": series, "xlabel": "concurrency",
            "ylabel": "TPOT (ms)", "title": "TPOT over context and concurrency: predicted vs measured",
            "file": "tpot_context_concurrency.png"}
