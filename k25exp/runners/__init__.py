"""One runner per experiment kind: a plain function `run(cfg, out_dir, recorder) -> summary`.

Runners know nothing of Hydra or MLflow: they take the typed config, write raw files,
tables and plots into `out_dir` as they go, and log figures through a Recorder. A runner
that fails raises after logging what it had measured.
"""

from __future__ import annotations

import importlib
from typing import Callable

# Experiment name → module holding its `run`; imported on demand, so a collective job does
# not pay for the serving stack's imports (transformers, httpx) and vice versa.
RUNNERS: dict[str, str] = {
    "nccl_burst": "k25exp.runners.nccl_burst",
    "allreduce_sweep": "k25exp.runners.allreduce_sweep",
    "all_to_all": "k25exp.runners.all_to_all",
    "gemm": "k25exp.runners.gemm",
    "macro": "k25exp.runners.macro",
    "spec_decode": "k25exp.runners.spec_decode",
    "profile": "k25exp.runners.profile",
    "trace_breakdown": "k25exp.runners.trace_breakdown",
    "report": "k25exp.runners.report",
}


def runner_for(experiment: object) -> Callable:
    name = getattr(experiment, "name", None)
    if name not in RUNNERS:
        raise KeyError(f"no runner for experiment {name!r} ({type(experiment).__name__}); "
                       f"known: {sorted(RUNNERS)}")
    return importlib.import_module(RUNNERS[name]).run
