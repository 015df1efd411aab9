"""The parts of a decode step no micro-benchmark covers, priced across context and concurrency,
and the prefills a step shares priced from measurements other than the level's own.

A campaign that sweeps the prompt length (experiment.input_tokens) profiles several request
shapes; a decode step's attention and KV reads grow with the context it holds, so the profile
of one shape cannot stand in for another, and holding a part at the nearest profiled
concurrency misses every level between. Here every uncovered part (each profile row no
micro-benchmark covers, idle less the profiler's overhead, the collectives' wait, the host gap
between steps) is fitted over ALL profiled points (ctx, c):

    u(c, ctx) = a + b·c + e·c·ctx

ctx = the mean context a decode step holds, input + output / 2 tokens (a request's context
grows from its prompt to prompt + output over its decode; a closed loop holds requests at
every position, a profile's wave passes through them all). Why these columns: a step's fixed
cost (launches, the host's scheduling, the sampler's setup) is a; what grows with the tokens
in the batch (norms, activations, the router, per-sequence bookkeeping) is b·c; what grows with
the tokens of context the batch attends to (attention, KV-cache reads: c sequences × ctx
tokens) is e·c·ctx. Nothing in a decode step grows with ctx at a fixed batch other than through
c·ctx, so a separate ctx column would fit noise. It fits: on the 2-core CPU (tiny_kimi, prompts
128 / 512 / 1536 profiled at c = 1 and 16) attention, 0.66 to 19.6 ms over the six points, left
at most 0.08 ms off the fit; idle, the part whose profiler overhead is measured against a
reference level minutes apart, up to 1.1 ms. Least squares; a column the profiled points do not
span (numerically dependent on those before it, in the order 1, c, c·ctx: all at one c, c is
the constant column) is left out, and the fit says which. With profiles of one context only,
the part is today's (k25exp.report.tpot_model): linear in c between profiled concurrencies,
held at the nearest outside them, at that context whatever the level's.

The prefills a step shares (prompt tokens prefilled inside a decode step per step: the macro
level's own count, prefill_tokens_per_decode_step, from its requests' send clock) are priced
at a cost per prompt token that is not the level's own: the prefill_shared_us_per_token slopes
of the OTHER closed-loop levels of the same request shape, their mean weighted by the requests
each was fitted over (leave-one-level-out: the marginal cost of a prompt token inside a decode
step, measured without a profiler; it depends on the prompt's length, not on c). The
preferred source. Without another level's slope, the profiles' prefill steps at that shape
(their time per prompt token, interpolated in c): whole prefill steps under the profiler,
which read high, and the note says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from k25exp.report.tpot_model import Priced, _lerp

COLUMNS = ("1", "c", "c·ctx")  # in the order they are kept: the last is dropped first


def context_of(input_tokens: float, output_tokens: float) -> float:
    """The mean context a decode step holds, tokens (module docstring)."""
    return input_tokens + output_tokens / 2


def _column(name: str, c: float, ctx: float) -> float:
    return {"1": 1.0, "c": c, "c·ctx": c * ctx}[name]


@dataclass(frozen=True)
class Fit:
    """One part's least-squares fit over the profiled points."""
    part: str
    columns: tuple[str, ...]           # the columns kept (COLUMNS less those not spanned)
    coef: tuple[float, ...]
    n: int                             # points fitted
    residual_max: float                # max |measured − fitted| ms over them

    def at(self, c: float, ctx: float) -> float:
        return sum(k * _column(name, c, ctx) for name, k in zip(self.columns, self.coef))

    @property
    def formula(self) -> str:
        terms = {"1": "a", "c": "b·c", "c·ctx": "e·c·ctx"}
        return " + ".join(terms[x] for x in self.columns)


def fit(part: str, points: Sequence[tuple[float, float, float]]) -> Fit:
    """Least squares of y on COLUMNS over (c, ctx, y) points, a column the points do not span
    (numerically dependent on those before it) left out."""
    if not points:
        raise ValueError(f"fit {part!r}: no profiled point has it")
    cols = {name: np.array([_column(name, c, x) for c, x, _ in points], dtype=float)
            for name in COLUMNS}
    kept: list[str] = []
    for name in COLUMNS:
        trial = np.column_stack([cols[n] / np.abs(cols[n]).max() for n in kept + [name]])
        if np.linalg.matrix_rank(trial, tol=1e-9 * max(trial.shape)) == len(kept) + 1:
            kept.append(name)
    X = np.column_stack([cols[n] for n in kept])
    y = np.array([v for _, _, v in points], dtype=float)
    coef, *_ = np.linalg.lstsq(X, y, rcond=None)
    res = np.abs(X @ coef - y)
    return Fit(part, tuple(kept), tuple(float(v) for v in coef), len(points), float(res.max()))


class Uncovered:
    """The uncovered parts at any (c, ctx), from the profiled points: {(ctx, c): {part: ms or
    None (that profile did not measure it)}}, idle already less the profiler's overhead."""

    def __init__(self, points: dict[tuple[float, int], dict[str, Optional[float]]]):
        self.points = points
        self.contexts = sorted({x for x, _ in points})
        self.parts: list[str] = []
        for parts in points.values():
            self.parts += [p for p in parts if p not in self.parts]
        self.fits: dict[str, Fit] = {}
        if len(self.contexts) > 1:
            for part in self.parts:
                pts = [(c, x, v[part]) for (x, c), v in sorted(points.items())
                       if v.get(part) is not None]
                if pts:
                    self.fits[part] = fit(part, pts)

    def at(self, c: int, ctx: float) -> tuple[dict[str, Optional[float]], str]:
        """Each part at (c, ctx) and how it was had (the table's words)."""
        if not self.points:  # missing, never 0 ms
            return {"profiles": None}, "no profile in the campaign"
        if len(self.contexts) == 1:  # today's: in c at the one profiled context
            only = self.contexts[0]
            out, held = {}, set()
            for part in self.parts:
                v, how = _lerp({k: p.get(part) for (_, k), p in self.points.items()}, c)
                out[part] = v
                if how:
                    held.add(how)
            how = ("interpolated in c" if not held else ", ".join(sorted(held)))
            same = abs(only - ctx) < 0.5
            return out, how + ("" if same else
                               f"; context held at the one profiled ({only:g} tokens)")
        out = {p: (self.fits[p].at(c, ctx) if p in self.fits else None) for p in self.parts}
        return out, self.how

    @property
    def how(self) -> str:
        """The fits in words: the usual one (points, formula), then each part fitted otherwise."""
        kinds = [(f.n, f.formula) for f in self.fits.values()]
        if not kinds:
            return "no fit"
        n, form = max(set(kinds), key=kinds.count)
        other = [f"{p}: {f.n} point{'s' * (f.n != 1)}, {f.formula}" for p, f in self.fits.items()
                 if (f.n, f.formula) != (n, form)]
        return (f"fit over {n} profiled points ({form})"
                + (f"; {'; '.join(other)}" if other else ""))


def other_levels_slope(level: int, slopes: dict[int, tuple[float, Optional[float]]]
                       ) -> Optional[tuple[float, str]]:
    """The prefill_shared_us_per_token of the closed-loop levels of one request shape other
    than `level`, their mean weighted by the requests each was fitted over; and a note naming
    them. None when no other level has a slope. slopes: {level: (µs, prefill_fit_n)}."""
    others = {k: (us, n or 1.0) for k, (us, n) in slopes.items() if k != level}
    if not others:
        return None
    w = sum(n for _, n in others.values())
    us = sum(v * n for v, n in others.values()) / w
    return us, ("the other levels' own slopes at this shape, weighted by their requests: "
                + ", ".join(f"c={k} {v:.2f} µs (n={n:.0f})" for k, (v, n) in sorted(others.items())))


def prefill_priced(level: int, tokens: Optional[float],
                   slopes: dict[int, tuple[float, Optional[float]]],
                   profiled: dict[int, Optional[float]]) -> tuple[Optional[float], str, str]:
    """(ms per decode step, how, note) of the prefills a step of `level` shares: its own
    prompt tokens per step × a cost per token not measured on the level (module docstring).
    `profiled`: the profiles' prefill_us_per_token at this shape, per profiled c."""
    if tokens is None:
        return None, "missing", ("missing: prefills shared (the macro run has no "
                                 "prefill_tokens_per_decode_step: a run older than that figure)")
    if tokens == 0:
        return 0.0, "none shared", ""
    other = other_levels_slope(level, slopes)
    if other is not None:
        us, note = other
        return tokens * max(us, 0.0) / 1e3, "other levels", (
            f"prefills shared: {tokens:.1f} prompt tokens per step × {us:.2f} µs"
            + (" (below 0: counted 0)" if us < 0 else "") + f", {note}")
    known = {k: v for k, v in profiled.items() if v is not None}
    if known:
        us, held = _lerp(known, level)
        return tokens * us / 1e3, "profiles' prefill steps", (
            f"prefills shared: {tokens:.1f} prompt tokens per step × {us:.2f} µs, the profiles' "
            "prefill steps at this shape (no other level has a slope of its own: whole prefill "
            "steps under the profiler, which read high)" + (f" ({held})" if held else ""))
    return None, "missing", ("missing: prefills shared (no other level of this shape has a "
                             "prefill_shared_us_per_token, and no profile of it timed a prefill step)")


def priced(parts: dict[str, Optional[float]], how: str,
           prefill: tuple[Optional[float], str, str]) -> Priced:
    return Priced(parts, how, prefill[0], prefill[2])
