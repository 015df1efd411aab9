"""What a report section holds: figures (a value and the runs it came from), tables, notes.

A figure whose source is missing has value None and says why (`missing`); nothing downstream
of it is computed from a default. Its metric (key, label, unit) comes from
k25exp.report.metrics.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Sequence, Union

from k25exp.report.metrics import Metric
from k25exp.tracking.read import RunView


@dataclass
class Figure:
    metric: Metric
    value: Optional[float]
    runs: list[RunView] = field(default_factory=list)
    note: str = ""
    missing: str = ""  # why value is None

    def __post_init__(self) -> None:
        if self.metric.key is None and self.value is not None:
            raise ValueError(f"figure {self.metric.label!r} has a value but no metric key: "
                             "declare its Metric in k25exp.report.metrics")

    @property
    def key(self) -> Optional[str]:
        return self.metric.key

    @property
    def label(self) -> str:
        return self.metric.label

    @property
    def unit(self) -> str:
        return self.metric.unit


@dataclass
class Table:
    title: str
    columns: list[str]
    rows: list[list[Any]]
    note: str = ""


@dataclass
class Section:
    title: str
    figures: list[Figure] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    plot: Optional[dict] = None  # data for render.py
    tags: dict[str, str] = field(default_factory=dict)  # set on the report run

    def get(self, which: Union[Metric, str]) -> Optional[Figure]:
        """The figure of a Metric (by its key: a figure may carry a more specific label), or
        of a label."""
        if isinstance(which, Metric):
            return next((f for f in self.figures if f.metric == which or
                         (which.key is not None and f.key == which.key)), None)
        return next((f for f in self.figures if f.label == which), None)


def missing(metric: Metric, why: str, runs: Sequence[RunView] = ()) -> Figure:
    return Figure(metric, None, list(runs), missing=why)


def share(part: Optional[float], whole: Optional[float]) -> Optional[float]:
    """part / whole in percent: every share k25exp logs is a percentage (the profile's
    share_* too), a difference of two shares is in percentage points (pp)."""
    return 100 * part / whole if part is not None and whole else None


def unique_runs(runs: Sequence[Optional[RunView]]) -> list[RunView]:
    seen, out = set(), []
    for r in runs:
        if r is not None and r.run_id not in seen:
            seen.add(r.run_id)
            out.append(r)
    return out
