"""Plain result tables, nccl-tests style: fixed-width text for people, CSV for programs."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence


@dataclass
class Column:
    header: str
    fmt: str = "{}"  # applied to numbers; None prints as "-", a string as itself (a reason)
    width: int = 12


def render(columns: Sequence[Column], rows: Sequence[Sequence[Any]], title: str = "") -> str:
    def cell(c: Column, v: Any) -> str:
        return "-" if v is None else v if isinstance(v, str) else c.fmt.format(v)

    lines = [f"# {title}"] if title else []
    lines.append("#" + "".join(c.header.rjust(c.width) for c in columns))
    for row in rows:
        lines.append(" " + "".join(cell(c, v).rjust(c.width) for c, v in zip(columns, row)))
    return "\n".join(lines) + "\n"


def write(path_stem: Path, columns: Sequence[Column], rows: Sequence[Sequence[Any]],
          title: str = "") -> str:
    """Writes <stem>.txt and <stem>.csv; returns the text table."""
    text = render(columns, rows, title)
    path_stem.with_suffix(".txt").write_text(text)
    with open(path_stem.with_suffix(".csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow([c.header for c in columns])
        w.writerows([["" if v is None else v for v in row] for row in rows])
    return text
