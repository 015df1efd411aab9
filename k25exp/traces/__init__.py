"""Trace analysis: where each decode step's time goes, from torch.profiler (Kineto/Chrome)
traces, one file per rank. Torch-, Hydra- and MLflow-free (numpy, orjson, msgspec when
present, PyYAML for the rules, matplotlib for plots).

    from k25exp.traces import analyze, write_outputs
    a = analyze([Path("rank0.pt.trace.json.gz"), Path("rank1.pt.trace.json.gz")])
    metrics = write_outputs(a, out_dir)      # tables, plots, JSON; returns the metrics
    print(summary_text(a)); json.dumps(a.to_dict())

Modules: reader (streaming parse), rules (YAML classification), steps (vLLM decode steps),
intervals (unions, self time), breakdown (per-step shares, across ranks), comm_split
(collective time split into wait for the last rank and transport, across ranks of one
host), report (writers); token_gaps, tail_causes, tail_outputs (the client's tokens joined to
the engine's steps on one clock, and the ITL tail by cause).
"""

from k25exp.traces.breakdown import (
    IDLE,
    Analysis,
    KernelStat,
    RankBreakdown,
    analyze,
    analyze_trace,
)
from k25exp.traces.comm_split import CommSplit, RankSplit
from k25exp.traces.reader import Trace, TraceError, read_trace
from k25exp.traces.outputs import summary_text, write_outputs
from k25exp.traces.rules import Rules, RulesError, default_rules_path, load_rules
from k25exp.traces.steps import StepInfo, parse_step_name

__all__ = [
    "IDLE", "Analysis", "CommSplit", "KernelStat", "RankBreakdown", "RankSplit", "Rules",
    "RulesError", "StepInfo",
    "Trace", "TraceError", "analyze", "analyze_trace", "default_rules_path", "load_rules",
    "parse_step_name", "read_trace", "summary_text", "write_outputs",
]
