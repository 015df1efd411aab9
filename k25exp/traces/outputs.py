"""Writers for a trace Analysis: tables (k25exp.tables), stacked-bar plots, JSON.

`write_outputs(analysis, out_dir)` writes, and returns the metrics dict:

    trace_breakdown.json        Analysis.to_dict() (what `k25exp analyze --json` prints)
    breakdown.txt / .csv        share of step time per category, group and idle: one column
                                per rank, then mean / min / median / max over ranks; with a
                                wait/transport split (≥ 2 ranks), its rows: [comm_wait],
                                [comm_transport] (% of step time, of raw call durations)
                                and ms per step of raw / wait / transport, calls matched
    top_kernels.txt / .csv      name, category, calls, total ms, mean µs, share (all ranks)
    top_kernels_<rank>.txt/.csv the same per rank (only with several ranks)
    steps_<rank>.csv            every analysed step: start, length and µs per category
                                (and comm wait / transport µs with a split)
    breakdown_<rank>.png        stacked bars, one per step (binned past 120 steps), ms
    breakdown_ranks.png         stacked bars, one per rank, % of step time
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np

from k25exp import stats, tables
from k25exp.tables import Column
from k25exp.traces.breakdown import IDLE, Analysis, RankBreakdown

MAX_BARS = 120
NAME_WIDTH = 70


def breakdown_rows(analysis: Analysis) -> tuple[list[Column], list[list]]:
    ranks = analysis.ranks
    shares = [r.shares() for r in ranks]
    groups = [r.group_shares() for r in ranks]
    cols = [Column("category", "{}", 18), Column("group", "{}", 15)]
    cols += [Column(r.label, "{:.2f}", 10) for r in ranks]
    cols += [Column(h, "{:.2f}", 9) for h in ("mean", "min", "median", "max")]
    rows: list[list] = []

    def row(name: str, group: str, xs: list[float]) -> list:
        return [name, group, *xs, stats.mean(xs), min(xs), stats.median(xs), max(xs)]

    for c in analysis.categories:
        rows.append(row(c, analysis.rules.group_of(c) or "-", [s[c] for s in shares]))
    rows.append(row(IDLE, "-", [s[IDLE] for s in shares]))
    for g in analysis.rules.groups:
        rows.append(row(f"[{g}]", "(sum)", [s[g] for s in groups]))
    rows.append(row("[overlap]", "(raw-work)", [r.overlap_share for r in ranks]))
    rows.append(["decode_step_ms", "-", *[r.decode_step_ms for r in ranks],
                 *_spread([r.decode_step_ms for r in ranks])])
    rows.append(["steps_analysed", "-", *[float(r.steps_analysed) for r in ranks],
                 *_spread([float(r.steps_analysed) for r in ranks])])
    if all(r.comm_split is not None for r in ranks):
        # raw call durations split at the last rank's arrival: not part of the 100 % above
        split = [r.comm_split_metrics() for r in ranks]
        for name, key, group in (("[comm_wait]", "share_comm_wait", "(raw calls)"),
                                 ("[comm_transport]", "share_comm_transport", "(raw calls)"),
                                 ("comm_raw_ms", "comm_raw_ms_per_step", "(per step)"),
                                 ("comm_wait_ms", "comm_wait_ms_per_step", "(per step)"),
                                 ("comm_transport_ms", "comm_transport_ms_per_step", "(per step)"),
                                 ("comm_calls_matched", "comm_calls_matched", "-")):
            rows.append(row(name, group, [s[key] for s in split]))
    return cols, rows


def _spread(xs: list[float]) -> list[float]:
    return [stats.mean(xs), min(xs), stats.median(xs), max(xs)]


_KERNEL_COLS = [Column("name", "{}", NAME_WIDTH + 2), Column("category", "{}", 17),
                Column("calls", "{:d}", 9), Column("total_ms", "{:.3f}", 11),
                Column("mean_us", "{:.2f}", 11), Column("share", "{:.2f}", 8)]


def _short(name: str) -> str:
    return name if len(name) <= NAME_WIDTH else name[: NAME_WIDTH - 1] + "…"


def _kernel_cols(rows: list[list]) -> list[Column]:
    w = max([len("name")] + [len(_short(r[0])) for r in rows]) + 2
    return [Column("name", "{}", w), *_KERNEL_COLS[1:]]


def _render_kernels(rows: list[list], title: str) -> str:
    return tables.render(_kernel_cols(rows), [[_short(r[0]), *r[1:]] for r in rows], title)


def _write_kernels(stem: Path, rows: list[list], title: str) -> str:
    tables.write(stem, _KERNEL_COLS, rows, title)          # CSV keeps full names
    text = _render_kernels(rows, title)
    stem.with_suffix(".txt").write_text(text)
    return text


def top_kernel_rows(analysis: Analysis, n: int | None = 30) -> list[list]:
    return [[k.name, k.category, k.calls, k.total_us / 1e3, k.mean_us, share]
            for k, share in analysis.top_kernels(n)]


def summary_text(analysis: Analysis, top: int = 15) -> str:
    """The breakdown table and the top kernels, as printed by the CLI."""
    cols, rows = breakdown_rows(analysis)
    r0 = analysis.ranks[0]
    title = (f"share of decode step time (%), {len(analysis.ranks)} rank(s), "
             f"{r0.mode} trace, steps from {r0.step_source}")
    out = tables.render(cols, rows, title)
    out += _render_kernels(top_kernel_rows(analysis, top),
                           f"top {top} kernels/operators over all ranks (time inside analysed steps)")
    for w in analysis.all_warnings():
        out += f"# warning: {w}\n"
    for n in analysis.notes:
        out += f"# note: {n}\n"
    return out


def _colors(categories: list[str]) -> dict[str, tuple]:
    import matplotlib
    cmap = matplotlib.colormaps["tab20"]
    out = {c: cmap(i % 20) for i, c in enumerate(categories)}
    out[IDLE] = (0.85, 0.85, 0.85, 1.0)
    return out


def plot_rank(path: Path, r: RankBreakdown) -> Path:
    """Stacked bars of one rank's steps: exclusive busy ms per category, then idle."""
    import matplotlib
    import matplotlib.pyplot as plt

    from k25exp import plots  # sets the Agg backend; imported only when plotting
    import matplotlib.ticker  # noqa: F401

    cats = r.categories + [IDLE]
    data = np.column_stack([r.busy_ns, r.step_ns - r.work_ns]) / 1e6  # [steps, cats+1] ms
    n = data.shape[0]
    xlabel = "decode step"
    if n > MAX_BARS:
        edges = np.linspace(0, n, MAX_BARS + 1).astype(int)
        data = np.array([data[a:b].mean(axis=0) for a, b in zip(edges[:-1], edges[1:])])
        xlabel = f"decode step (mean of bins of ~{n / MAX_BARS:.1f} steps)"
    colors = _colors(r.categories)
    fig, ax = plt.subplots(figsize=(max(6.0, min(14.0, 0.12 * data.shape[0] + 4)), 4.5))
    x = np.arange(data.shape[0])
    bottom = np.zeros(data.shape[0])
    for j, c in enumerate(cats):
        if not data[:, j].any():
            continue
        ax.bar(x, data[:, j], bottom=bottom, width=0.85, color=colors[c], label=c)
        bottom += data[:, j]
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.set(xlabel=xlabel, ylabel="ms",
           title=f"{r.label}: decode step breakdown ({r.steps_analysed} steps, "
                 f"mean {r.decode_step_ms:.3f} ms)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return plots.save(fig, path)


def plot_ranks(path: Path, analysis: Analysis) -> Path:
    """One stacked bar per rank: % of step time per category and idle."""
    import matplotlib.pyplot as plt

    from k25exp import plots  # sets the Agg backend; imported only when plotting

    cats = analysis.categories + [IDLE]
    colors = _colors(analysis.categories)
    shares = [r.shares() for r in analysis.ranks]
    fig, ax = plt.subplots(figsize=(max(5.0, 0.8 * len(shares) + 4), 4.5))
    x = np.arange(len(shares))
    bottom = np.zeros(len(shares))
    for c in cats:
        v = np.array([s[c] for s in shares])
        if not v.any():
            continue
        ax.bar(x, v, bottom=bottom, width=0.7, color=colors[c], label=c)
        bottom += v
    ax.set_xticks(x, [r.label for r in analysis.ranks])
    ax.set(ylabel="% of decode step time", ylim=(0, 100),
           title="decode step breakdown per rank")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return plots.save(fig, path)


def write_steps_csv(path: Path, r: RankBreakdown) -> Path:
    sp = r.comm_split
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step", "name", "start_us", "dur_us", *[f"{c}_us" for c in r.categories],
                    "idle_us", "work_us", *(["comm_wait_us", "comm_transport_us"] if sp else [])])
        for i, st in enumerate(r.steps):
            split = ([f"{sp.wait_ns[i].sum() / 1e3:.3f}", f"{sp.transport_ns[i].sum() / 1e3:.3f}"]
                     if sp else [])
            w.writerow([i, st.name, st.start_ns / 1e3, st.dur_ns / 1e3,
                        *[f"{v / 1e3:.3f}" for v in r.busy_ns[i]],
                        f"{(r.step_ns[i] - r.work_ns[i]) / 1e3:.3f}", f"{r.work_ns[i] / 1e3:.3f}",
                        *split])
    return path


def write_outputs(analysis: Analysis, out_dir: Path | str, top: int = 30,
                  plots: bool = True) -> dict[str, float]:
    """Writes every artifact listed in the module docstring into out_dir; returns the
    metrics (Analysis.metrics())."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "trace_breakdown.json").write_text(json.dumps(analysis.to_dict(top=top), indent=1))
    cols, rows = breakdown_rows(analysis)
    tables.write(out / "breakdown", cols, rows, "share of decode step time (%)")
    _write_kernels(out / "top_kernels", top_kernel_rows(analysis, top),
                   "top kernels/operators over all ranks (time inside analysed steps)")
    if len(analysis.ranks) > 1:
        for r in analysis.ranks:
            t = r.total_step_ns / 1e3
            _write_kernels(out / f"top_kernels_{r.label}",
                           [[k.name, k.category, k.calls, k.total_us / 1e3, k.mean_us,
                             100.0 * k.total_us / t] for k in r.kernels[:top]],
                           f"{r.label}: top kernels/operators")
    for r in analysis.ranks:
        write_steps_csv(out / f"steps_{r.label}.csv", r)
        if plots:
            plot_rank(out / f"breakdown_{r.label}.png", r)
    if plots:
        plot_ranks(out / "breakdown_ranks.png", analysis)
    return analysis.metrics()
