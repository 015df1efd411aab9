"""trace_breakdown: the trace analyser on traces you already have, logged as a run."""

from __future__ import annotations

from pathlib import Path

from k25exp.config.experiments import TraceBreakdownConfig
from k25exp.config.schema import K25Config
from k25exp.runners.profile import breakdown
from k25exp.tracking.recorder import Recorder


def expand(paths: list[str], glob: str) -> list[Path]:
    """Files as given; folders searched (recursively) for `glob`. Missing paths are errors."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            out += sorted(x for x in p.rglob(glob) if "async_llm" not in x.name)
        elif p.exists():
            out.append(p)
        else:
            raise FileNotFoundError(f"experiment.paths: {p} does not exist")
    return out


def run(cfg: K25Config, out: Path, rec: Recorder) -> dict[str, float]:
    exp: TraceBreakdownConfig = cfg.experiment
    paths = expand(exp.paths, exp.trace_glob)
    if not paths:
        raise FileNotFoundError(f"experiment.paths={exp.paths}: no trace matching {exp.trace_glob!r}")
    return breakdown(paths, exp, out, rec)


def recover(out: Path, rec: Recorder) -> str:
    """A killed job's figures (`k25exp recover`): the given traces analysed again."""
    from k25exp.config.validate import typed_from_folder

    run(typed_from_folder(out), out, rec)
    return "the given traces analysed again (k25exp.traces), as the job would have"
