"""The comparison as a terminal table (rich), Markdown and one self-contained HTML page.

All three are written from the same Comparison: a warning first where a pair's runs sent
different requests (k25exp.compare.shapes); per pair of runs, every figure with A, B,
the change, which way is better, the adjusted p-value, the bootstrap interval of the median's
change and the verdict; then the environment (tags) and config (params) that differ.
"""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Optional

from k25exp import html_page
from k25exp.compare.directions import RULES
from k25exp.compare.table import Comparison, Row
from k25exp.tracking.ui_links import run_url

COLUMNS = ("figure", "A", "B", "change", "better", "p (Holm)", "median change, 95 % CI",
           "significant", "note")


def num(v: Optional[float]) -> str:
    if v is None:
        return "-"
    if not math.isfinite(v):
        return "n/a"
    if v != 0 and (abs(v) >= 1e5 or abs(v) < 1e-3):
        return f"{v:.3g}"
    return f"{v:.4g}"


def pct(v: Optional[float]) -> str:
    return "-" if v is None or not math.isfinite(v) else f"{v:+.1f} %"


def verdict(r: Row) -> str:
    if r.significant is None:
        return "-"
    if r.within_noise:
        return "no (within noise)"
    return ("YES, worse beyond --fail-on" if r.worse_beyond else "yes") if r.significant else "no"


def cells(r: Row) -> list[str]:
    t = r.test
    return [r.figure, num(r.a), num(r.b), pct(r.change_pct), r.better,
            "-" if r.p_adjusted is None else f"{r.p_adjusted:.2g}",
            "-" if t is None else f"{pct(t.median_change_pct)} [{pct(t.ci_low_pct)}, {pct(t.ci_high_pct)}] "
                                  f"(n {t.n_a}/{t.n_b})",
            verdict(r), r.note]


def by_pair(c: Comparison) -> dict[str, list[Row]]:
    out: dict[str, list[Row]] = {}
    for r in c.rows:
        out.setdefault(r.pair, []).append(r)
    return out


def pair_links(c: Comparison, label: str) -> list[tuple[str, str, str]]:
    """(side, short id, MLflow UI link) of a pair's two runs."""
    p = next(p for p in c.pairs if p.label == label)
    return [(side, r.short, run_url(c.ui_url, r)) for side, r in (("A", p.a), ("B", p.b))]


def pair_title(c: Comparison, label: str) -> str:
    p = next(p for p in c.pairs if p.label == label)
    return f"{label}: A {p.a.short} vs B {p.b.short}"


def header(c: Comparison) -> str:
    return (f"A = {c.a.kind} {c.a.ident} ({len(c.a.runs)} run(s)), "
            f"B = {c.b.kind} {c.b.ident} ({len(c.b.runs)} run(s)); {len(c.pairs)} pair(s), "
            f"{len(c.rows)} figures, {sum(r.test is not None for r in c.rows)} tested, "
            f"{len(c.significant)} significant")


def verdict_line(c: Comparison) -> str:
    if c.fail_on is None:
        return ""
    if c.failing:
        return (f"FAIL: {len(c.failing)} significant change(s) worse by more than {c.fail_on:g} %: "
                + ", ".join(f"{r.pair} {r.figure} (median {pct(r.test.median_change_pct)})"
                            for r in c.failing[:10]))
    return f"ok: no significant change worse by more than {c.fail_on:g} %"


def print_terminal(c: Comparison, console=None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = console or Console(width=200)
    console.print(header(c))
    for line in c.shape_diff:
        console.print(f"WARNING: {line}", style="bold yellow", markup=False)
    for label, rows in by_pair(c).items():
        t = Table(title=pair_title(c, label), title_justify="left")
        for col in COLUMNS:
            t.add_column(col, overflow="fold", justify="left" if col in ("figure", "note") else "right")
        for r in rows:
            style = "bold red" if r.worse_beyond else ("yellow" if r.significant else None)
            t.add_row(*cells(r), style=style)
        console.print(t)
    for title, diff in (("environment (tags) that differs", c.tag_diff),
                        ("config (params) that differs within pairs", c.param_diff)):
        t = Table(title=title, title_justify="left")
        for col in ("key", "A", "B"):
            t.add_column(col, overflow="fold")
        for row in diff:
            t.add_row(*row)
        if not diff:
            t.add_row("(none)", "", "")
        console.print(t)
    for line in c.unmatched:
        console.print(f"unmatched: {line}")
    for n in c.notes:
        console.print(f"note: {n}")
    if verdict_line(c):
        console.print(verdict_line(c))


def _md(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


def markdown(c: Comparison, generated: str, plot_file: Optional[str] = None) -> str:
    lines = [f"# k25exp compare: {c.a.ident} vs {c.b.ident}", "", header(c) + f"; generated {generated}.", ""]
    lines += [f"> **Warning:** {_md(line)}\n" for line in c.shape_diff]
    if verdict_line(c):
        lines += [f"**{verdict_line(c)}**", ""]
    if plot_file:
        lines += [f"![median change per tested figure]({plot_file})", ""]
    for label, rows in by_pair(c).items():
        lines += [f"## {_md(pair_title(c, label))}", "",
                  " · ".join(f"{side}: [{short}]({url})" for side, short, url in pair_links(c, label)),
                  "", "| " + " | ".join(COLUMNS) + " |",
                  "|" + "---|" * len(COLUMNS)]
        # a figure worse beyond --fail-on, or significant, reads bold (the page's highlight)
        lines += ["| " + " | ".join(f"**{_md(x)}**" if (r.worse_beyond or r.significant) and x
                                    else _md(x) for x in cells(r)) + " |" for r in rows]
        lines.append("")
    for title, diff in (("Environment (tags) that differs", c.tag_diff),
                        ("Config (params) that differs within pairs", c.param_diff)):
        lines += [f"## {title}", "", "| key | A | B |", "|---|---|---|"]
        lines += [f"| {_md(k)} | {_md(x)} | {_md(y)} |" for k, x, y in diff] or ["| (none) | | |"]
        lines.append("")
    lines += ["## Notes", ""] + [f"- unmatched: {_md(u)}" for u in c.unmatched] + \
             [f"- {_md(n)}" for n in c.notes]
    lines += ["", "Which way is better (first matching rule on the metric's name; none: never "
              "fails `--fail-on`):", "", "| name matches | better | kind |", "|---|---|---|"]
    lines += [f"| `{_md(p)}` | {b} | {k} |" for p, b, k in RULES]
    return "\n".join(lines) + "\n"


def change_plot(c: Comparison) -> Optional[bytes]:
    """PNG: each tested figure's median change with its bootstrap interval."""
    tested = [r for r in c.rows if r.test is not None and math.isfinite(r.test.median_change_pct)]
    if not tested:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seen, rows = set(), []
    for r in tested:  # one bar per sample set (p50 and mean share theirs)
        if id(r.test) not in seen:
            seen.add(id(r.test))
            rows.append(r)
    fig, ax = plt.subplots(figsize=(8, 0.3 * len(rows) + 1.2))
    ys = range(len(rows))
    mids = [r.test.median_change_pct for r in rows]
    err = [[m - r.test.ci_low_pct for m, r in zip(mids, rows)],
           [r.test.ci_high_pct - m for m, r in zip(mids, rows)]]
    colors = ["#c00" if r.worse_beyond else "#d80" if r.significant else "#555" for r in rows]
    ax.errorbar(mids, list(ys), xerr=err, fmt="none", ecolor=colors)
    ax.scatter(mids, list(ys), c=colors, zorder=3)
    ax.axvline(0, color="#999", lw=0.8)
    ax.set_yticks(list(ys), [f"{r.pair} {r.figure}"[:60] for r in rows], fontsize=7)
    ax.set_xlabel("median change B vs A (%), bootstrap 95 % interval")
    ax.invert_yaxis()
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return buf.getvalue()


def write(folder: Path, c: Comparison, generated: str) -> tuple[Path, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    plot = change_plot(c)
    if plot:
        (folder / "median_change.png").write_bytes(plot)
    md, page = folder / "compare.md", folder / "compare.html"
    text = markdown(c, generated, "median_change.png" if plot else None)
    md.write_text(text)
    page.write_text(html_page.render(text, f"k25exp compare {c.a.ident} vs {c.b.ident}", folder))
    return md, page
