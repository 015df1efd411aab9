"""Every experiment, one module per family: each schema class is the experiment's one unit
(its fields and defaults, its runner, its checks, its recovery and where its samples are:
k25exp.config.experiments.base). Importing this package registers them all."""

from k25exp.config.experiments.base import (
    EXPERIMENT_SCHEMAS,
    ExperimentBase,
    Registered,
    experiment,
)
from k25exp.config.experiments.collectives import (
    AllReduceSweepConfig,
    AllToAllConfig,
    CollectiveExperiment,
    FaultConfig,
    NcclBurstConfig,
)
from k25exp.config.experiments.gemm import GemmConfig
from k25exp.config.experiments.report import ExternalBurst, ReportConfig, ScaleOutConfig
from k25exp.config.experiments.serving import (
    MacroConfig,
    MacroFaultConfig,
    SloConfig,
    SloSearchConfig,
    SpecDecodeConfig,
)
from k25exp.config.experiments.speculative import SpeculativeSettings
from k25exp.config.experiments.traces import ProfileConfig, SpecProfileConfig, TraceBreakdownConfig

__all__ = [
    "EXPERIMENT_SCHEMAS", "ExperimentBase", "Registered", "experiment", "AllReduceSweepConfig",
    "AllToAllConfig", "CollectiveExperiment", "FaultConfig", "NcclBurstConfig", "GemmConfig",
    "ExternalBurst", "ReportConfig", "ScaleOutConfig", "MacroConfig", "MacroFaultConfig",
    "SloConfig", "SloSearchConfig", "SpecDecodeConfig", "SpeculativeSettings", "ProfileConfig",
    "SpecProfileConfig", "TraceBreakdownConfig",
]
