"""A live progress bar per serving phase (rich); silent when disabled (experiment.progress)."""

from __future__ import annotations

from typing import Optional


class Progress:
    """A live progress bar per phase (rich); silent when disabled."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.p = None

    def __enter__(self):
        if self.enabled:
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                                       TimeElapsedColumn)

            self.p = Progress(TextColumn("{task.description:>18}"), BarColumn(),
                              MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                              TimeElapsedColumn())
            self.p.start()
        return self

    def __exit__(self, *exc):
        if self.p:
            self.p.stop()

    def task(self, name: str, total: Optional[int]):
        return self.p.add_task(name, total=total, info="") if self.p else None

    def update(self, task, rec: dict, errors: int) -> None:
        if self.p is not None and task is not None:
            tpot = rec.get("tpot_s")
            info = f"err {errors}" + (f"  tpot {tpot * 1e3:.1f} ms" if tpot else "")
            self.p.update(task, advance=1, info=info)
