"""trace_breakdown: the trace analyser on traces you already have, logged as a run."""

from __future__ import annotations

from pathlib import Path

from k25exp.config.experiments import TraceBreakdownConfig
from k25exp.config.schema import K25Config
from k25exp.runners.profile import breakdown
from k25exp.traces.files import trace_files
from k25exp.tracking.recorder import Recorder


def run(cfg: K25Config, out: Path, rec: Recorder) -> dict[str, float]:
    exp: TraceBreakdownConfig = cfg.experiment
    try:
        paths = trace_files(exp.paths, exp.trace_glob)
    except FileNotFoundError as e:
        raise FileNotFoundError(f"experiment.paths: {e}") from None
    if not paths:
        raise FileNotFoundError(f"experiment.paths={exp.paths}: no trace matching {exp.trace_glob!r}")
    return breakdown(paths, exp, out, rec)


def recover(out: Path, rec: Recorder) -> str:
    """A killed job's figures (`k25exp recover`): the given traces analysed again."""
    from k25exp.config.validate import typed_from_folder

    run(typed_from_folder(out), out, rec)
    return "the given traces analysed again (k25exp.traces), as the job would have"
