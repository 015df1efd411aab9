"""The report's plots (PNG), from each Section's plot data."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from k25exp import plots
from k25exp.report.figures import Section


def make_plots(sections: Sequence[Section], folder: Path) -> dict[str, Path]:
    out: dict[str, Path] = {}
    for s in sections:
        p = s.plot
        if not p:
            continue
        if p["kind"] == "budget" and p["tpot"] and all(v is not None for v in p["parts"].values()):
            out[s.title] = _budget_plot(folder / "decode_budget.png", p)
        elif p["kind"] == "ep" and any(v is not None for v in p["ep"]):
            out[s.title] = plots.sweep(folder / "ep_vs_tp.png", p["x"],
                                       {"EP: 2 × All-to-All × MoE layers": p["ep"],
                                        "TP: AllReduce × MoE layers": p["tp"]},
                                       "concurrency", "ms per decode step",
                                       "Expert parallelism vs the AllReduce it replaces", logy=True)
        elif p["kind"] == "sweep":
            out[s.title] = plots.sweep(folder / p["file"], p["x"], p["series"], p["xlabel"],
                                       p["ylabel"], p["title"], logx=p.get("logx", True))
    return out


def budget_bars(parts: dict[str, float]) -> list[tuple[str, float, float, str]]:
    """(name, left, width, legend label) per part of the budget bar: the parts stacked in
    order; a negative part (the residual rest, when the parts exceed TPOT) drawn back from the
    end of the stack over the length it overshoots, and labelled negative."""
    bars, left = [], 0.0
    for name, v in parts.items():
        if v < 0:
            bars.append((name, left + v, -v, f"{name} −{-v:.2f} ms (negative: the parts exceed TPOT)"))
        else:
            bars.append((name, left, v, f"{name} {v:.2f} ms"))
        left += v
    return bars


def _budget_plot(path: Path, p: dict) -> Path:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 2.8))
    for i, (name, left, width, label) in enumerate(budget_bars(p["parts"])):
        negative = "negative" in label
        ax.barh([0], [width], left=left, color="white" if negative else f"C{i}",
                edgecolor=f"C{i}", hatch="//" if negative else None, label=label)
    ax.axvline(p["tpot"], color="black", linestyle="--", label=f"TPOT {p['tpot']:.2f} ms")
    ax.set(yticks=[], xlabel="ms", title="One decode step at batch 1")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.5), ncol=4)
    return plots.save(fig, path)


