"""One runner per experiment kind: a plain function `run(cfg, out_dir, recorder) -> summary`.

Runners know nothing of Hydra or MLflow: they take the typed config, write raw files,
tables and plots into `out_dir` as they go, and log figures through a Recorder. A runner
that fails raises after logging what it had measured.
"""

from __future__ import annotations

from typing import Callable

from k25exp.config.schema import AllReduceSweepConfig, AllToAllConfig, GemmConfig, NcclBurstConfig
from k25exp.runners import all_to_all, allreduce_sweep, gemm, nccl_burst
from k25exp.config.schema import MacroConfig
from k25exp.runners import macro

RUNNERS: dict[type, Callable] = {
    NcclBurstConfig: nccl_burst.run,
    AllReduceSweepConfig: allreduce_sweep.run,
    AllToAllConfig: all_to_all.run,
    GemmConfig: gemm.run,
    MacroConfig: macro.run,
}


def runner_for(experiment: object) -> Callable:
    try:
        return RUNNERS[type(experiment)]
    except KeyError:
        raise KeyError(f"no runner for experiment config {type(experiment).__name__}") from None
