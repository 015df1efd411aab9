"""The comparison itself: every figure of every pair of runs, A, B, change, significance.

A figure's A and B are the values the runs logged; its significance comes from the raw
samples behind it (k25exp.compare.samples): Mann-Whitney U, Holm-adjusted over every distinct
sample set tested in this compare (all pairs together: `judge`), and a bootstrap 95 %
interval of the median's change. A served level its run flagged invalid, or whose validity
flag is absent, gets no verdict.
A change is called significant only when it is also larger than the noise floor (`noise`,
percent of the median): two runs of one setup on a shared machine drift by a few percent, and
samples as tight as a timer's detect that drift with tiny p-values; a change smaller than it is
reported as within noise, never as a regression. `--fail-on PCT` fails on a figure whose
change is significant, goes the declared worse way (k25exp.compare.directions) and exceeds PCT
percent.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

from k25exp.compare import directions, envdiff, resolve, samples, shapes
from k25exp.compare import significance as stats
from k25exp.tracking import read

DEFAULT_NOISE_PCT = 5.0
# Bookkeeping timings of the job itself, not figures of what was measured.
SKIP_METRICS = ("measure_s", "job_s", "torchrun_s", "server_start_s")


@dataclass
class Row:
    pair: str
    metric: str
    step: Optional[int]
    a: Optional[float]
    b: Optional[float]
    better: str  # directions.LOWER | HIGHER | UNKNOWN
    test: Optional[stats.Test] = None
    p_adjusted: Optional[float] = None
    significant: Optional[bool] = None  # None: not tested (note says why)
    within_noise: bool = False  # p < alpha but the median moved less than the noise floor
    note: str = ""
    worse_beyond: bool = False  # counts against --fail-on
    not_judged: str = ""  # why the level's figures get no verdict (flagged invalid, unknown)

    @property
    def figure(self) -> str:
        return self.metric + (f" @{self.step}" if self.step is not None else "")

    @property
    def change_pct(self) -> Optional[float]:
        if self.a is None or self.b is None or self.a == 0 or not math.isfinite(self.a):
            return None
        return (self.b - self.a) / abs(self.a) * 100


@dataclass
class Comparison:
    a: resolve.Side
    b: resolve.Side
    pairs: list[resolve.Pair]
    rows: list[Row]
    unmatched: list[str]
    tag_diff: list[tuple[str, str, str]]
    param_diff: list[tuple[str, str, str]]
    alpha: float
    fail_on: Optional[float]
    noise: float = DEFAULT_NOISE_PCT
    notes: list[str] = field(default_factory=list)
    # pairs whose runs sent different requests (k25exp.compare.shapes): said above the figures
    shape_diff: list[str] = field(default_factory=list)
    ui_url: str = "http://127.0.0.1:5000"  # where `k25exp ui` serves the store: the pages link runs there

    @property
    def failing(self) -> list[Row]:
        return [r for r in self.rows if r.worse_beyond]

    @property
    def significant(self) -> list[Row]:
        return [r for r in self.rows if r.significant]


SERVED = ("macro", "spec_decode")  # experiments whose levels carry a validity flag


def _validity(experiment: str, fa: dict, fb: dict, metric: str, step: Optional[int]) -> str:
    """Why a figure's level is not judged ("" when it is): a side flagged it invalid (its
    `valid` at that step, or `single_stream_valid` for the single-stream figures; a
    `baseline/` figure by the baseline's own flag), or, for a served experiment, a side
    logged no flag for it (validity unknown: never taken for valid)."""
    prefix = metric.split("/", 1)[0] + "/" if metric.startswith("baseline/") else ""
    bare = metric[len(prefix):]
    key = (prefix + "valid", step) if step is not None else \
        (prefix + "single_stream_valid", None) if bare.startswith("single_stream_") else None
    if key is None:
        return ""
    bad = [side for side, f in (("A", fa), ("B", fb)) if f.get(key) == 0]
    if bad:
        return f"level flagged invalid in {' and '.join(bad)}"
    unknown = [side for side, f in (("A", fa), ("B", fb)) if key not in f]
    if experiment in SERVED and unknown:
        return f"validity unknown in {' and '.join(unknown)} (no `{key[0]}` logged for it)"
    return ""


def pair_rows(p, fa: dict, fb: dict, sa: dict, sb: dict, problem: str) -> list[Row]:
    """Rows of one pair: every figure either side logged (fa, fb: (metric, step) -> value),
    tested where both kept samples (sa, sb; one test per distinct pair of sample sets);
    `problem` says why samples are missing. No verdict yet: `judge` gives it."""
    rows: list[Row] = []
    tests: dict[tuple[int, int], Optional[stats.Test]] = {}
    for fig in sorted(set(fa) | set(fb), key=lambda f: (f[1] is not None, f[1] or 0, f[0])):
        metric, step = fig
        better, _ = directions.direction(metric)
        row = Row(p.label, metric, step, fa.get(fig), fb.get(fig), better)
        if fig in sa and fig in sb:
            ident = (id(sa[fig]), id(sb[fig]))
            if ident not in tests:
                tests[ident] = stats.compare_samples(sa[fig], sb[fig])
            row.test = tests[ident]
            if row.test is None:
                row.note = (f"not tested (fewer than {stats.MIN_SAMPLES} samples: "
                            f"{len(sa[fig])} vs {len(sb[fig])})")
        else:
            row.note = samples.why_no_samples(p.experiment, metric, bool(sa and sb), problem)
            if fig in sa or fig in sb:
                row.note = f"no samples in {'B' if fig in sa else 'A'}"
        if better == directions.UNKNOWN:
            row.note = (row.note + "; " if row.note else "") + "direction unknown: never fails"
        row.not_judged = _validity(p.experiment, fa, fb, metric, step)
        rows.append(row)
    return rows


def judge(rows: list[Row], alpha: float, fail_on: Optional[float], noise: float) -> list[Row]:
    """The verdicts: p-values Holm-adjusted over every distinct test in `rows` (the whole
    compare, so alpha bounds the family-wise error of everything it calls significant), then
    significance (p < alpha and a median move beyond the noise floor) and --fail-on."""
    distinct = list({id(r.test): r.test for r in rows if r.test is not None}.items())
    adjusted = dict(zip((k for k, _ in distinct), stats.holm([t.p for _, t in distinct])))
    for row in rows:
        if row.test is None:
            continue
        row.p_adjusted = adjusted[id(row.test)]
        moved = abs(row.test.median_change_pct) > noise
        row.within_noise = row.p_adjusted < alpha and not moved
        row.significant = row.p_adjusted < alpha and moved
        if row.not_judged:  # a level that measured the client (or may have) is not judged
            row.note = (row.note + "; " if row.note else "") + f"not judged: {row.not_judged}"
            row.significant, row.within_noise = False, False
            continue
        # the verdict is on what was tested, the samples' median: a mean can move the other
        # way (one outlier), and must not fail the gate while the distribution improved
        ch = row.test.median_change_pct
        if (fail_on is not None and row.significant and ch is not None
                and directions.is_worse(row.metric, ch) and abs(ch) > fail_on):
            row.worse_beyond = True
    return rows


def judge_pairs(inputs, alpha: float, fail_on: Optional[float], noise: float) -> list[Row]:
    """Every pair's rows, judged together: inputs = (pair, fa, fb, sa, sb, problem) each."""
    return judge([row for args in inputs for row in pair_rows(*args)], alpha, fail_on, noise)


def judge_pair(p, fa: dict, fb: dict, sa: dict, sb: dict, problem: str, alpha: float,
               fail_on: Optional[float], noise: float) -> list[Row]:
    """The rows of one pair as a compare of that pair alone."""
    return judge(pair_rows(p, fa, fb, sa, sb, problem), alpha, fail_on, noise)


def compare(uri: str, a_id: str, b_id: str, alpha: float = 0.05,
            fail_on: Optional[float] = None, noise: float = DEFAULT_NOISE_PCT) -> Comparison:
    c = read.client(uri)
    a, b = resolve.resolve(c, a_id), resolve.resolve(c, b_id)
    pairs, unmatched = resolve.match(a, b)
    inputs = []
    notes: list[str] = []
    for p in pairs:
        fa, fb = resolve.figures(c, p.a, SKIP_METRICS), resolve.figures(c, p.b, SKIP_METRICS)
        sa, problem_a = resolve.fetch_samples(uri, p.a)
        sb, problem_b = resolve.fetch_samples(uri, p.b)
        inputs.append((p, fa, fb, sa, sb, "; ".join(x for x in (problem_a, problem_b) if x)))
    rows = judge_pairs(inputs, alpha, fail_on, noise)
    if any(r.test for r in rows):
        n = len({id(r.test) for r in rows if r.test})
        notes.append(f"significant = Mann-Whitney U two-sided p < {alpha:g} after Holm's "
                     f"adjustment over the {n} distinct sample sets tested in this compare "
                     "(every pair); interval = "
                     f"bootstrap 95 % of the median's change ({stats.BOOTSTRAP_RESAMPLES} "
                     f"resamples, seed {stats.BOOTSTRAP_SEED}); a median change within "
                     f"±{noise:g} % (the noise floor) is never called significant")
    for side in (a, b):
        if side.left_out:
            notes.append(f"left out of {side.ident}: {', '.join(side.left_out)} (not finished)")
    return Comparison(a, b, pairs, rows, unmatched, envdiff.tag_diff(a, b, pairs),
                      envdiff.param_diff(pairs), alpha, fail_on, noise, notes,
                      shapes.shape_notes(pairs))

