"""Writers for the ITL tail by cause (k25exp.traces.tail_causes): tables, every gap joined,
the worst requests' timelines.

`write_tail(tail, out_dir, worst=3)` writes, and returns the figures (tail.* and clock.*):

    causes.txt / .csv      the tail decomposed: per cause, the tail gaps it is the cause of,
                           its ms of their excess over the median ITL and its share
    tail_gaps.csv          every tail gap: request, chunk, gap, excess, each cause's ms, the
                           cause, its joined parts (own step, host gap, ...), the step's kind
                           and batch (decode requests, prefill tokens) and, where the breakdown
                           analysed that step, what grew in it (its categories over the median)
    token_gaps.csv.gz      every gap of the level joined to its steps (parts, delivery delay)
    steps.csv              every engine step on the timeline (ms): start, done, the next
                           step's launch (async scheduling), kind, batch
    timeline.png           the worst requests: the steps around their worst gap (what each
                           held for the request: its own, skipped, prefill), the chunks'
                           arrivals, the gap's parts
    worst.txt              the worst request's timeline as text
    clock.json             the alignment: bracket, shift, the client clock's pair
"""

from __future__ import annotations

import csv
import gzip
import io
import json
from pathlib import Path

import numpy as np

from k25exp import tables
from k25exp.tables import Column
from k25exp.traces.tail_causes import ALL, Tail, TailGap
from k25exp.traces.token_gaps import Gap

COLORS = {"decode": "#4c72b0", "mixed": "#dd8452", "prefill": "#c44e52", "empty": "#bbbbbb"}


def causes_table(t: Tail) -> str:
    cols = [Column("cause", "{}", 13), Column("tail_gaps", "{:d}", 11),
            Column("ms", "{:.1f}", 11), Column("pct_of_excess", "{:.1f}", 15)]
    p99 = f"{t.p99_ms:.1f} ms" if t.p99_ms is not None else "n/a"
    title = (f"ITL tail by cause: {len(t.gaps)} gaps above {t.threshold_ms:.1f} ms (p99 {p99}, "
             f"p50 {t.p50_ms:.1f} ms, n = {t.n}) or ending a delivery stall; ms of their excess "
             f"over the p50; named causes hold {t.caused_pct() or 0:.1f} %")
    return tables.render(cols, t.rows(), title)


def _gap_fields(g: Gap) -> list:
    return [g.request, g.chunk, g.tokens, round(g.gap_ms, 4), g.step, g.prev_step,
            *(round(v, 4) for v in g.parts().values()), round(g.deliver_ms, 4),
            g.skipped_steps, int(g.stall)]


GAP_HEADER = ["request", "chunk", "tokens", "gap_ms", "step", "prev_step", *Gap.PARTS,
              "deliver_ms", "skipped_steps", "stall"]


def step_categories(steps_csv: Path, offset_ns: int, steps) -> dict[int, dict[str, float]]:
    """The breakdown's categories (ms) of the steps it analysed (its steps_<rank>.csv, start
    in µs on the trace's zero), by engine step index (k25exp.traces.token_gaps.EngineStep,
    on the system clock: `offset_ns` = the trace's Trace.clock_offset_ns)."""
    by_start = {round((s.start_ns - offset_ns) / 1e3): s.index for s in steps}
    out: dict[int, dict[str, float]] = {}
    with open(steps_csv, newline="") as f:
        for row in csv.DictReader(f):
            i = by_start.get(round(float(row["start_us"])))
            if i is not None:
                out[i] = {k[:-3]: float(v) / 1e3 for k, v in row.items()
                          if k.endswith("_us") and k not in ("start_us", "dur_us", "work_us")
                          and not k.startswith("comm_wait") and not k.startswith("comm_transport") and v}
    return out


def grew(cats: dict[int, dict[str, float]], step: int, top: int = 2) -> str:
    """What made an analysed step longer than the median analysed step: its categories' ms
    above each one's median, the largest `top` ("moe +3.1 ms, attention +0.8 ms"); "" when
    the breakdown did not analyse it."""
    if step not in cats or len(cats) < 3:
        return ""
    names = cats[step].keys()
    med = {c: float(np.median([v.get(c, 0.0) for v in cats.values()])) for c in names}
    up = sorted(((cats[step][c] - med[c], c) for c in names), reverse=True)[:top]
    return ", ".join(f"{c} +{d:.1f} ms" for d, c in up if d >= 0.05)


def write_tail(t: Tail, out: Path, worst: int = 3,
               categories: dict[int, dict[str, float]] | None = None) -> dict[str, float]:
    """`categories`: the breakdown's categories of the steps it analysed (step_categories):
    what grew in each tail gap's own step, when it was analysed (tail_gaps.csv, worst.txt)."""
    cats = categories or {}
    out.mkdir(parents=True, exist_ok=True)
    text = causes_table(t)
    (out / "causes.txt").write_text(text + "".join(f"# note: {n}\n" for n in t.notes))
    with open(out / "causes.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["cause", "tail_gaps", "ms", "pct_of_excess"])
        w.writerows([["" if v is None else v for v in row] for row in t.rows()])
    steps = t.join.steps
    with open(out / "tail_gaps.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(GAP_HEADER + ["excess_ms", *[f"{c}_ms" for c in ALL], "cause", "above_p99",
                                 "step_kind", "step_decode_requests", "step_prefill_tokens",
                                 "step_grew"])
        for tg in sorted(t.gaps, key=lambda x: -x.gap.gap_ms):
            st = steps[tg.gap.step] if tg.gap.step >= 0 else None
            w.writerow(_gap_fields(tg.gap) + [round(tg.excess_ms, 4),
                                              *(round(tg.parts[c], 4) for c in ALL), tg.cause,
                                              int(tg.above_p99), st.kind if st else "",
                                              st.info.generation_requests if st else "",
                                              (st.info.context_tokens or 0) if st else "",
                                              grew(cats, tg.gap.step) if st else ""])
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(GAP_HEADER)
    w.writerows(_gap_fields(g) for g in t.join.gaps)
    (out / "token_gaps.csv.gz").write_bytes(gzip.compress(buf.getvalue().encode()))
    start, done = t.join.step_ms()
    with open(out / "steps.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step", "name", "kind", "start_ms", "done_ms", "next_launched_ms",
                    "decode_requests", "prefill_requests", "prefill_tokens"])
        zero = t.join.zero_ns
        for s, a, b in zip(steps, start, done):
            nl = "" if s.next_launched_ns is None else round((s.next_launched_ns - zero) / 1e6, 4)
            w.writerow([s.index, s.name, s.kind, round(a, 4), round(b, 4), nl,
                        s.info.generation_requests, s.info.context_requests,
                        s.info.context_tokens if s.info.context_tokens is not None else ""])
    al = t.join.alignment
    (out / "clock.json").write_text(json.dumps(
        {"lo_ms": al.lo_ms, "hi_ms": al.hi_ms, "shift_ms": al.shift_ms, "error_ms": al.error_ms,
         "lower_n": al.lower_n, "upper_n": al.upper_n, "pair_us": al.pair_us,
         "drift_us": al.drift_us, "note": al.note, "zero_ns": t.join.zero_ns}, indent=1))
    worst_gaps = _worst(t, worst)
    if worst_gaps:
        (out / "worst.txt").write_text(timeline_text(t, worst_gaps[0], cats))
        plot_timelines(out / "timeline.png", t, worst_gaps)
    return {**t.metrics(), **al.metrics()}


def _worst(t: Tail, n: int) -> list[TailGap]:
    """n requests' worst joined tail gaps: the worst of each cause first (the longest gap
    first), then the longest of the rest, one per request."""
    best: dict[int, TailGap] = {}
    for tg in t.gaps:
        if tg.gap.step < 0:
            continue
        cur = best.get(tg.gap.request)
        if cur is None or tg.gap.gap_ms > cur.gap.gap_ms:
            best[tg.gap.request] = tg
    ranked = sorted(best.values(), key=lambda x: -x.gap.gap_ms)
    out: list[TailGap] = []
    for tg in ranked:
        if tg.cause not in {x.cause for x in out}:
            out.append(tg)
    out += [tg for tg in ranked if tg not in out]
    return sorted(out[:n], key=lambda x: -x.gap.gap_ms)


def _role(t: Tail, tg: TailGap, i: int) -> str:
    """What step i was for the request, around its gap."""
    g = tg.gap
    if i == g.step:
        return "own"
    if i == g.prev_step:
        return "previous"
    if g.prev_step < i < g.step:
        s = t.join.steps[i]
        if not s.decodes:
            return "prefill-only" if s.prefills else "empty"
        dec = [k for k in range(g.prev_step + 1, g.step) if t.join.steps[k].decodes]
        return "merged" if i in dec[max(0, len(dec) - (g.tokens - 1)):] and g.tokens > 1 else "skipped"
    return ""


def timeline_text(t: Tail, tg: TailGap, cats: dict[int, dict[str, float]] | None = None,
                  context: int = 2) -> str:
    """The steps from `context` before the gap's previous step to `context` after its own,
    and the request's chunks in that span (ms from the previous chunk's arrival)."""
    g, j = tg.gap, t.join
    r = next(x for x in j.requests if x.i == g.request)
    start, done = j.step_ms()
    t0 = float(r.arrive_ms[g.chunk - 1])
    lo, hi = max(0, g.prev_step - context), min(len(j.steps) - 1, g.step + context)
    lines = [f"request {g.request}, chunk {g.chunk}: gap {g.gap_ms:.1f} ms (p50 {t.p50_ms:.1f}, "
             f"threshold {t.threshold_ms:.1f}), excess {tg.excess_ms:.1f} ms, cause {tg.cause}",
             "  excess by cause (ms): " + ", ".join(f"{c} {tg.parts[c]:.1f}" for c in ALL if tg.parts[c]),
             "  gap parts (ms): " + ", ".join(f"{k[:-3]} {v:.1f}" for k, v in g.parts().items()),
             *([f"  its step grew (breakdown categories over the median analysed step): {x}"]
               if (x := grew(cats or {}, g.step)) else []),
             f"  times in ms from chunk {g.chunk - 1}'s arrival; request in a step: inferred",
             f"  {'step':>6} {'start':>9} {'done':>9} {'ms':>7}  {'kind':<8}{'decode':>7}"
             f"{'prefill_tok':>12}  for this request"]
    events = [(float(start[i]), f"  {i:>6} {start[i] - t0:9.1f} {done[i] - t0:9.1f} "
               f"{done[i] - start[i]:7.1f}  {j.steps[i].kind:<8}"
               f"{j.steps[i].info.generation_requests:>7}{j.steps[i].info.context_tokens or 0:>12}"
               f"  {_role(t, tg, i)}") for i in range(lo, hi + 1)]
    for k, a in enumerate(r.arrive_ms):
        if start[lo] - 1 <= a <= done[hi] + abs(g.deliver_ms) + 1:
            events.append((float(a), f"  {'chunk':>6} {a - t0:9.1f} {'':>9} {'':>7}  arrives "
                                     f"({int(r.tokens[k])} token{'s' if r.tokens[k] > 1 else ''}) chunk {k}"))
    lines += [e for _, e in sorted(events, key=lambda x: x[0])]
    return "\n".join(lines) + "\n"


def plot_timelines(path: Path, t: Tail, worst: list[TailGap], context: int = 3) -> Path:
    from k25exp.plots import plt, save

    j = t.join
    start, done = j.step_ms()
    fig, axes = plt.subplots(len(worst), 1, figsize=(11, 2.3 * len(worst) + 0.6), squeeze=False)
    for ax, tg in zip(axes[:, 0], worst):
        g = tg.gap
        r = next(x for x in j.requests if x.i == g.request)
        t0 = float(r.arrive_ms[g.chunk - 1])
        lo, hi = max(0, g.prev_step - context), min(len(j.steps) - 1, g.step + context)
        for i in range(lo, hi + 1):
            role = _role(t, tg, i)
            ax.barh(1, done[i] - start[i], left=start[i] - t0, height=0.6,
                    color=COLORS[j.steps[i].kind], edgecolor="black",
                    linewidth=2.0 if role == "own" else 0.4,
                    hatch="//" if role == "skipped" else ("xx" if role == "merged" else None))
            if role:
                ax.text((start[i] + done[i]) / 2 - t0, 1.42, role, ha="center", fontsize=7)
        x0, x1 = start[lo] - t0, done[hi] - t0 + max(0.0, g.deliver_ms)
        for k, a in enumerate(r.arrive_ms):
            if x0 - 1 <= a - t0 <= x1 + 1:
                ax.plot([a - t0] * 2, [-0.3, 0.3], color="black", lw=1.5 if k == g.chunk else 0.8)
        ax.annotate("", xy=(g.gap_ms, 0.0), xytext=(0.0, 0.0),
                    arrowprops=dict(arrowstyle="<->", color="red"))
        ax.annotate("", xy=(r.arrive_ms[g.chunk] - t0, 0.55), xytext=(done[g.step] - t0, 0.7),
                    arrowprops=dict(arrowstyle="->", color="grey"))
        parts = ", ".join(f"{c} {tg.parts[c]:.0f}" for c in ALL if tg.parts[c] >= 0.5)
        ax.set_title(f"request {g.request}, chunk {g.chunk}: gap {g.gap_ms:.1f} ms "
                     f"(p50 {t.p50_ms:.1f}) — {tg.cause}; excess ms: {parts}", fontsize=9)
        ax.set_yticks([0, 1], ["client", "engine"])
        ax.set_ylim(-0.6, 1.7)
        ax.set_xlim(min(x0, 0) - 2, max(x1, g.gap_ms) + 2)
        ax.grid(True, axis="x", alpha=0.3)
    axes[-1, 0].set_xlabel("ms from the previous chunk's arrival\nsteps: blue decode, orange "
                           "+ prefill, red prefill only, grey empty; hatched skipped, crossed "
                           "merged, bold made the token; grey arrow: delivery")
    fig.tight_layout()
    return save(fig, path)

