"""The report as Markdown (report.md + plots/), and the same as one self-contained HTML page
rendered from it (k25exp.html_page).

Every figure names and links the MLflow run it came from; a missing figure is printed as
`missing` with its reason, never as a number. In a campaign whose server ran on one rank, a
missing collectives phase (nccl_burst, allreduce_sweep, all_to_all) is marked as one that
needs two or more GPUs.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Optional, Sequence

from k25exp import html_page
from k25exp.config.experiments import EXPERIMENT_SCHEMAS, CollectiveExperiment
from k25exp.report import metrics as M
from k25exp.report import provenance
from k25exp.report.charts import make_plots
from k25exp.report.figures import Figure, Section
from k25exp.report.measured import one_rank
from k25exp.report.sources import PHASES, Campaign
from k25exp.tracking.read import RunView
from k25exp.tracking.ui_links import run_url

HEADLINE = (M.TPOT, M.COMM_SHARE_BURST, M.COMM_SHARE_TRANSPORT, M.COMM_SHARE_WAIT,
            M.COMM_SHARE_DIFF, M.TPOT_PRED_WORST, M.TPOT_CTX_PRED_WORST, M.GEMM_SHARE,
            M.EP_BREAK_EVEN)
CAVEATS = ("random weights", "refused:")  # notes that change how every figure reads


def headline_notes(sections: Sequence[Section]) -> list[str]:
    return [n for s in sections for n in s.notes if any(k in n for k in CAVEATS)]


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
            if (f.key or "").startswith(M.SPEC_MEASURED) or f.key == M.SPEC_MODEL_ERR_MAX.key]
    return out


def headline_text(figs: Sequence[Figure]) -> str:
    w = max(len(f.label) for f in figs) if figs else 10
    lines = []
    for f in figs:
        val = _value(f)
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
             ui_url: str, folder: Path, generated: str, ran: str) -> str:
    """The report's markdown; `ran` is provenance.ran_with's line for the header."""
    lines = [f"# k25exp campaign report: {c.id}", "",
             f"Store `{c.uri}`, {len(c.runs)} phase runs; generated {generated}. "
             f"Run links open in `k25exp ui` ({ui_url}).", "",
             f"Ran with: {_md_text(ran) or 'nothing the runs agree on'}.",
             "", "## Headline", "",
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
    multi = set(multi_gpu_phases()) if one_rank(c) else set()
    lines += ["", "## Phases", "", "| phase | finished runs | other runs |", "|---|---|---|"]
    for p in PHASES:
        fin = c.of(p)
        other = [r for r in c.of(p, None) if r.status != "FINISHED"]
        none = "missing (needs two or more GPUs)" if p in multi else "missing"
        lines.append(f"| {p} | {_md_runs(fin, ui_url) or none} | "
                     f"{', '.join(f'{r.short} {r.status}' for r in other)} |")
    if missing:
        lines += ["", f"Missing phases: {', '.join(missing)}."]
        if multi & set(missing):
            lines += ["", f"The campaign's server ran on one rank (world size 1): "
                      f"{', '.join(p for p in missing if p in multi)} need two or more GPUs."]
    return "\n".join(lines) + "\n"


def multi_gpu_phases() -> list[str]:
    """The phases that time collectives across ranks: nothing to time on one GPU."""
    return [p for p in PHASES if issubclass(EXPERIMENT_SCHEMAS[p], CollectiveExperiment)]


def write(folder: Path, c: Campaign, sections: Sequence[Section], ui_url: str,
          generated: str, same_code: Sequence[str] = ()) -> tuple[Path, Path, Optional[str]]:
    folder.mkdir(parents=True, exist_ok=True)
    plot_files = make_plots(sections, folder / "plots")
    md = folder / "report.md"
    ran = provenance.ran_with(c, same_code)  # the header's line, and the job's summary's
    text = markdown(c, sections, plot_files, ui_url, folder, generated, ran)
    md.write_text(text)
    page = folder / "report.html"
    page.write_text(html_page.render(text, f"k25exp report {c.id}", folder))
    caveats = "".join(f"\nNOTE: {n}" for n in headline_notes(sections))
    return md, page, (f"ran with: {ran}\n" + headline_text(headline(sections))
                      + caveats)
