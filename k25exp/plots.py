"""PNG plots for sweeps (matplotlib, headless)."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Optional, Sequence

import matplotlib

matplotlib.use("Agg")  # no display on GPU nodes or CI
import matplotlib.pyplot as plt  # noqa: E402


def sweep(path: Path, x: Sequence[float], series: Mapping[str, Sequence[Optional[float]]],
          xlabel: str, ylabel: str, title: str, logx: bool = True, logy: bool = False,
          vline: Optional[float] = None, vline_label: str = "") -> Path:
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name, ys in series.items():
        pts = [(a, b) for a, b in zip(x, ys) if b is not None]
        if pts:
            ax.plot(*zip(*pts), marker="o", label=name)
    if vline is not None:
        ax.axvline(vline, color="red", linestyle="--", label=vline_label)
    if logx:
        ax.set_xscale("log", base=2)
    if logy:
        ax.set_yscale("log")
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    return save(fig, path)


def histogram(path: Path, samples_us: Sequence[float], title: str,
              marks: Mapping[str, float] = {}) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ax.hist(samples_us, bins=min(60, max(10, len(samples_us) // 20)), color="tab:blue", alpha=0.8)
    for i, (name, v) in enumerate(marks.items()):
        ax.axvline(v, color=f"C{i + 1}", linestyle="--", label=f"{name} {v:.1f} µs")
    ax.set(xlabel="per-op latency (µs)", ylabel="ops", title=title)
    if marks:
        ax.legend()
    return save(fig, path)


def save(fig, path: Path) -> Path:
    """Lay out, write the PNG (folders made as needed) and free the figure."""
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
