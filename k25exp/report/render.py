"""The report as Markdown (report.md + plots/) and one self-contained HTML page.

Both are written from the same Sections; every figure names and links the MLflow run it
came from; a missing figure is printed as `missing` with its reason, never as a number.
"""

from __future__ import annotations

import base64
import html
import math
from pathlib import Path
from typing import Any, Optional, Sequence

from k25exp.report import metrics as M
from k25exp.report.charts import make_plots
from k25exp.report.figures import Figure, Section
from k25exp.report.sources import PHASES, Campaign, RunView

HEADLINE = (M.TPOT, M.COMM_SHARE_BURST, M.COMM_SHARE_TRANSPORT, M.COMM_SHARE_WAIT,
            M.COMM_SHARE_DIFF, M.TPOT_PRED_WORST, M.GEMM_SHARE, M.EP_BREAK_EVEN)
CAVEATS = ("random weights", "refused:")  # notes that change how every figure reads


def headline_notes(sections: Sequence[Section]) -> list[str]:
    return [n for s in sections for n in s.notes if any(k in n for k in CAVEATS)]


def run_url(ui_url: str, r: RunView) -> str:
    return f"{ui_url.rstrip('/')}/#/experiments/{r.experiment_id}/runs/{r.run_id}"


def fmt(v: Any, unit: str = "") -> str:
    if v is None:
        return "missing"
    if isinstance(v, RunView):
        return v.short
    if isinstance(v, float):
        if math.isnan(v):
            return "n/a"
        if unit == "%":  # a share, already in percent (k25exp.report.metrics)
            return f"{v:.1f} %"
        if unit == "pp":
            return f"{v:+.1f} pp"
        if unit == "pct":  # already in percent (a signed error)
            return f"{v:+.1f} %"
        if unit.startswith("% of"):  # already in percent, of what the unit names
            return f"{v:.1f}"
        if unit == "×":
            return f"{v:.3f}×"
        if v.is_integer() and unit in ("", "tokens/GPU"):
            return str(int(v))
        if abs(v) >= 100:
            return f"{v:.1f}"
        return f"{v:.3f}" if abs(v) >= 0.01 or v == 0 else f"{v:.3g}"
    return str(v)


def headline(sections: Sequence[Section]) -> list[Figure]:
    figs = {f.key or f.label: f for s in sections for f in s.figures}  # by key: labels may vary
    out = [figs[m.key or m.label] for m in HEADLINE if (m.key or m.label) in figs]
    out += [f for s in sections for f in s.figures
            if (f.key or "").startswith((M.SPEC_MEASURED, M.SPEC_PROJECTED))]
    return out


def headline_text(figs: Sequence[Figure]) -> str:
    w = max(len(f.label) for f in figs) if figs else 10
    lines = []
    for f in figs:
        val = fmt(f.value, f.unit) + ("" if f.unit in ("%", "pp", "pct", "×", "") or f.value is None
                                      else f" {f.unit}")
        src = ", ".join(r.short for r in f.runs)
        lines.append(f"{f.label:<{w}}  {val:>12}  {('runs ' + src) if src else ''}"
                     + (f"  ({f.missing})" if f.value is None and f.missing else ""))
    return "\n".join(lines)


def _value(f: Figure) -> str:
    return fmt(f.value, f.unit) + ("" if f.unit in ("%", "pp", "pct", "×", "") or f.value is None
                                   else f" {f.unit}")


# ----------------------------------------------------------------------------------------
# Markdown


def _md_cell(v: Any, ui_url: str) -> str:
    if isinstance(v, RunView):
        return f"[{v.short}]({run_url(ui_url, v)})"
    return fmt(v).replace("|", "\\|")


def _md_text(s: str) -> str:
    """Free text (notes, error messages) inside a Markdown table cell."""
    return s.replace("|", "\\|").replace("\n", " ")


def _md_runs(runs: Sequence[RunView], ui_url: str) -> str:
    return ", ".join(f"[{r.short}]({run_url(ui_url, r)})" for r in runs)


def _md_figure(f: Figure, ui_url: str) -> str:
    return (f"| {_md_text(f.label)} | {_value(f)} | {_md_runs(f.runs, ui_url)} | "
            f"{_md_text(f.missing if f.value is None else f.note)} |")


def markdown(c: Campaign, sections: Sequence[Section], plot_files: dict[str, Path],
             ui_url: str, folder: Path, generated: str) -> str:
    lines = [f"# k25exp campaign report: {c.id}", "",
             f"Store `{c.uri}`, {len(c.runs)} phase runs; generated {generated}. "
             f"Run links open in `k25exp ui` ({ui_url}).", "", "## Headline", "",
             "| figure | value | runs | note |", "|---|---|---|---|"]
    lines += [_md_figure(f, ui_url) for f in headline(sections)]
    lines += [f"\n**{_md_text(n)}**" for n in headline_notes(sections)]
    for s in sections:
        lines += ["", f"## {s.title}", "", "| figure | value | runs | note |", "|---|---|---|---|"]
        lines += [_md_figure(f, ui_url) for f in s.figures]
        for n in s.notes:
            lines += ["", f"- {n}"]
        if s.title in plot_files:
            lines += ["", f"![{s.title}]({plot_files[s.title].relative_to(folder).as_posix()})"]
        for t in s.tables:
            lines += ["", f"### {t.title}", "", "| " + " | ".join(t.columns) + " |",
                      "|" + "---|" * len(t.columns)]
            lines += ["| " + " | ".join(_md_cell(v, ui_url) for v in row) + " |" for row in t.rows]
            if t.note:
                lines += ["", f"_{t.note}_"]
    missing = sorted(c.missing_phases())
    lines += ["", "## Phases", "", "| phase | finished runs | other runs |", "|---|---|---|"]
    for p in PHASES:
        fin = c.of(p)
        other = [r for r in c.of(p, None) if r.status != "FINISHED"]
        lines.append(f"| {p} | {_md_runs(fin, ui_url) or 'missing'} | "
                     f"{', '.join(f'{r.short} {r.status}' for r in other)} |")
    if missing:
        lines += ["", f"Missing phases: {', '.join(missing)}."]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------
# HTML (self-contained: plots inlined as base64 PNG)

_CSS = """body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:.6em 0;font-size:.9em}th,td{border:1px solid #ccc;padding:.25em .6em;text-align:right}
th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}.missing{color:#b00}.note{color:#555;font-size:.9em}
img{max-width:100%}code{background:#f3f3f3;padding:0 .2em}"""


def _h(v: Any, ui_url: str, unit: str = "") -> str:
    if isinstance(v, RunView):
        return f'<a href="{html.escape(run_url(ui_url, v))}">{v.short}</a>'
    s = html.escape(fmt(v, unit))
    return f'<span class="missing">{s}</span>' if v is None else s


def _h_runs(runs: Sequence[RunView], ui_url: str) -> str:
    return ", ".join(_h(r, ui_url) for r in runs)


def _h_figs(figs: Sequence[Figure], ui_url: str) -> list[str]:
    out = ["<table><tr><th>figure</th><th>value</th><th>runs</th><th>note</th></tr>"]
    for f in figs:
        val = (_h(f.value, ui_url, f.unit) +
               ("" if f.unit in ("%", "pp", "pct", "×", "") or f.value is None else f" {f.unit}"))
        note = f.missing if f.value is None else f.note
        out.append(f"<tr><td>{html.escape(f.label)}</td><td>{val}</td><td>{_h_runs(f.runs, ui_url)}"
                   f"</td><td class=note>{html.escape(note)}</td></tr>")
    return out + ["</table>"]


def html_page(c: Campaign, sections: Sequence[Section], plot_files: dict[str, Path],
              ui_url: str, generated: str) -> str:
    out = ["<!doctype html><html><head><meta charset=utf-8>",
           f"<title>k25exp report {html.escape(c.id)}</title><style>{_CSS}</style></head><body>",
           f"<h1>k25exp campaign report: {html.escape(c.id)}</h1>",
           f"<p class=note>Store <code>{html.escape(c.uri)}</code>, {len(c.runs)} phase runs; "
           f"generated {html.escape(generated)}. Run links open in <code>k25exp ui</code> "
           f"({html.escape(ui_url)}).</p>", "<h2>Headline</h2>"]
    out += _h_figs(headline(sections), ui_url)
    out += [f"<p><b>{html.escape(n)}</b></p>" for n in headline_notes(sections)]
    for s in sections:
        out.append(f"<h2>{html.escape(s.title)}</h2>")
        out += _h_figs(s.figures, ui_url)
        if s.notes:
            out.append("<ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in s.notes) + "</ul>")
        if s.title in plot_files:
            b64 = base64.b64encode(plot_files[s.title].read_bytes()).decode()
            out.append(f'<img alt="{html.escape(s.title)}" src="data:image/png;base64,{b64}">')
        for t in s.tables:
            out.append(f"<h3>{html.escape(t.title)}</h3><table><tr>" +
                       "".join(f"<th>{html.escape(x)}</th>" for x in t.columns) + "</tr>")
            out += ["<tr>" + "".join(f"<td>{_h(v, ui_url)}</td>" for v in row) + "</tr>"
                    for row in t.rows]
            out.append("</table>")
            if t.note:
                out.append(f"<p class=note>{html.escape(t.note)}</p>")
    out.append("</body></html>")
    return "\n".join(out)


def write(folder: Path, c: Campaign, sections: Sequence[Section], ui_url: str,
          generated: str) -> tuple[Path, Path, Optional[str]]:
    folder.mkdir(parents=True, exist_ok=True)
    plot_files = make_plots(sections, folder / "plots")
    md = folder / "report.md"
    md.write_text(markdown(c, sections, plot_files, ui_url, folder, generated))
    page = folder / "report.html"
    page.write_text(html_page(c, sections, plot_files, ui_url, generated))
    caveats = "".join(f"\nNOTE: {n}" for n in headline_notes(sections))
    return md, page, headline_text(headline(sections)) + caveats
