"""Run ids, sweep parent ids and campaign ids → the runs to compare, paired.

The runs are read through k25exp.tracking.read (compare's own run is written by track.py). A
side is one run, a multirun's children (given the parent's id) or a campaign's phase runs
(given its `campaign` tag). Runs of the two sides are paired by experiment and by
the values of the params their sweep varied (those that differ between runs of one experiment
on either side); runs of different experiments are never paired, and a compare whose sides
share no experiment is refused naming both.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from k25exp.tracking import read
from k25exp.tracking.read import RunView

# Params that differ between runs for reasons other than what was measured.
RUN_SPECIFIC_PARAMS = ("paths.", "hydra.", "tracking.run_name", "tracking.campaign",
                       "experiment.campaign")  # the report's: which campaign it read


class CompareError(RuntimeError):
    """The ids name nothing comparable; the message says which and why."""


@dataclass
class Side:
    ident: str
    kind: str  # "run" | "sweep" | "campaign"
    runs: list[RunView]
    left_out: list[str] = field(default_factory=list)  # unfinished runs, named

    def experiments(self) -> list[str]:
        return sorted({r.phase for r in self.runs})


@dataclass
class Pair:
    experiment: str
    swept: dict[str, str]  # the swept params' values both runs share
    a: RunView
    b: RunView

    @property
    def label(self) -> str:
        sweep = " ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in self.swept.items())
        return f"{self.experiment}" + (f" [{sweep}]" if sweep else "")


def resolve(c, ident: str) -> Side:
    """A run id, a sweep parent's run id or a campaign id, as a Side of finished runs."""
    run = read.run(c, ident)
    if run is not None and run.is_parent:
        side = Side(ident, "sweep", read.children(c, ident))
    elif run is not None:
        side = Side(ident, "run", [run])
    elif "'" in ident:
        raise CompareError(f"{ident!r} is not a run id, and a campaign id has no quote in it")
    else:
        side = Side(ident, "campaign", read.campaign_runs(c, ident))
        if not side.runs:
            raise CompareError(f"{ident!r} is neither a run id, a sweep parent's run id nor a "
                               f"campaign id in {getattr(c, 'tracking_uri', 'the store')}")
    finished = [r for r in side.runs if r.status == "FINISHED"]
    side.left_out = [f"{r.short} ({r.phase or '?'}) {r.status}" for r in side.runs if r.status != "FINISHED"]
    side.runs = finished
    if not finished:
        raise CompareError(f"{ident!r} ({side.kind}) has no finished run: "
                           f"{', '.join(side.left_out)}")
    return side


def swept_params(runs: list[RunView]) -> list[str]:
    """Params whose value differs between the given runs (of one experiment, one side)."""
    keys = sorted({k for r in runs for k in r.params})
    return [k for k in keys if not k.startswith(RUN_SPECIFIC_PARAMS)
            and len({r.params.get(k) for r in runs}) > 1]


def match(a: Side, b: Side) -> tuple[list[Pair], list[str]]:
    """Pairs of runs (same experiment, same swept values) and what could not be paired."""
    common = sorted(set(a.experiments()) & set(b.experiments()))
    if not common:
        raise CompareError(
            f"A ({a.kind} {a.ident}) holds runs of experiment {', '.join(a.experiments())}; B "
            f"({b.kind} {b.ident}) holds {', '.join(b.experiments())}: runs of different "
            "experiments measure different things and are not compared")
    pairs, unmatched = [], []
    for e in sorted(set(a.experiments()) | set(b.experiments())):
        ra = [r for r in a.runs if r.phase == e]
        rb = [r for r in b.runs if r.phase == e]
        if not ra or not rb:
            side = "A" if ra else "B"
            unmatched.append(f"{e}: only {side} has runs of it ({len(ra or rb)})")
            continue
        keys = sorted(set(swept_params(ra)) | set(swept_params(rb)))

        def key(r: RunView) -> tuple:
            return tuple(r.params.get(k) for k in keys)

        def newest(rs: list[RunView]) -> dict[tuple, RunView]:
            out: dict[tuple, RunView] = {}
            for r in sorted(rs, key=lambda r: r.start_time):
                out[key(r)] = r  # a repeated point: the newest run of it
            return out

        na, nb = newest(ra), newest(rb)
        for k in sorted(set(na) | set(nb), key=str):
            swept = {name: str(v) for name, v in zip(keys, k)}
            if k in na and k in nb:
                pairs.append(Pair(e, swept, na[k], nb[k]))
            else:
                label = " ".join(f"{n}={v}" for n, v in swept.items())
                unmatched.append(f"{e} [{label}]: only in {'A' if k in na else 'B'} "
                                 f"(run {(na.get(k) or nb.get(k)).short})")
    return pairs, unmatched


def figures(c, r: RunView, skip: tuple[str, ...] = ()) -> dict[tuple[str, Optional[int]], float]:
    """Every metric of the run as figures: (name, None) for run-level ones, (name, step) for
    each step of a metric logged per step (a sweep inside the job)."""
    out: dict[tuple[str, Optional[int]], float] = {}
    for key in sorted(r.metrics):
        if key in skip:
            continue
        hist = read.history(c, r.run_id, key)
        if set(hist) <= {0}:
            out[(key, None)] = r.metrics[key]
        else:
            out.update({(key, s): v for s, v in sorted(hist.items())})
    return out


def fetch_samples(uri: str, r: RunView):
    """(the run's samples by figure, a problem reading them or "")."""
    from k25exp.compare.samples import source

    found = source(r.phase)  # the experiment's schema says where its samples are
    if found is None:
        return {}, ""
    paths, reader = found
    with tempfile.TemporaryDirectory(prefix="k25exp-compare-") as tmp:
        got = []
        for p in paths:
            try:
                # into its own parent folder: a file artifact lands at dst/<basename>
                # (spec/requests.jsonl and baseline/requests.jsonl would land on one path)
                dst = Path(tmp) / Path(p).parent
                dst.mkdir(parents=True, exist_ok=True)
                read.download_artifact(uri, r.run_id, p, dst)
                got.append(p)
            except Exception as e:  # an artifact that was never logged
                if p == paths[0]:
                    return {}, f"run {r.short} kept no `{p}` artifact ({type(e).__name__})"
        try:
            return reader(Path(tmp)), ""
        except Exception as e:
            return {}, f"run {r.short}'s {', '.join(got)}: {type(e).__name__}: {e}"
