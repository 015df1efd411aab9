"""Registers the schemas in Hydra's ConfigStore and the resolvers the YAML files use."""

from __future__ import annotations

import math
import os
import re
from pathlib import Path

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from k25exp.config.experiments import EXPERIMENT_SCHEMAS
from k25exp.config.schema import (
    HardwareConfig,
    K25Config,
    ModelConfig,
    ServerConfig,
    TrackingConfig,
)
from k25exp.dtypes import dtype_bytes


def project_root() -> Path:
    """Where outputs/ goes: $K25EXP_ROOT when set, else the source checkout this package
    runs from, else (an installed wheel) the working directory."""
    env = os.environ.get("K25EXP_ROOT")
    if env:
        return Path(env).resolve()
    src = Path(__file__).resolve().parents[2]
    if (src / "pyproject.toml").exists() and (src / "conf").is_dir():
        return src
    return Path.cwd().resolve()


def conf_dir() -> Path:
    """The config tree: k25exp/conf (a link to the checkout's conf/, real files in a wheel)."""
    return Path(__file__).resolve().parents[1] / "conf"


def _mul(*xs) -> int | float:
    return math.prod(xs)


def first_host(nodelist: str) -> str:
    """The first host of a SLURM node list: 'gpu[03-05,9],cpu1' → 'gpu03'."""
    m = re.match(r"([^\[,]+)(?:\[([^\],-]+))?", nodelist.strip())
    if not m:
        raise ValueError(f"cannot read a host from SLURM node list {nodelist!r}")
    return m.group(1) + (m.group(2) or "")


def rank_threads(device: str, tp: int) -> int | None:
    """CPU threads one TP rank of a CPU-build server gets (server.cpu_threads_bind=split: an
    equal block of this process's CPUs each), so a micro-benchmark runs on what a rank has;
    None on CUDA (torch's default)."""
    if device != "cpu":
        return None
    import os

    return max(1, len(os.sched_getaffinity(0)) // max(int(tp), 1))


def slurm_master(port: int = 29500) -> str:
    """host:port of node 0 of this SLURM job (for hardware.rdzv_endpoint)."""
    nodes = os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST")
    if not nodes:
        raise ValueError("${k25.slurm_master:} needs SLURM_JOB_NODELIST: not inside a SLURM job")
    return f"{first_host(nodes)}:{port}"


def default_communicator(nnodes: int = 1) -> str:
    """vllm when vLLM is importable (time the path its server runs) on one node, else torch
    (across nodes the vllm communicator is not supported yet: CollectiveExperiment.check says so)."""
    import importlib.util

    return "vllm" if int(nnodes) == 1 and importlib.util.find_spec("vllm") is not None else "torch"


def store_uri(outputs: str | Path | None = None) -> str:
    """The MLflow store every command opens unless told otherwise: $MLFLOW_TRACKING_URI, else
    the embedded default, a SQLite file under the outputs folder (default: the project's)."""
    outputs = Path(outputs) if outputs is not None else project_root() / "outputs"
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{outputs / 'mlflow.db'}"


def sqlite_path(uri: str) -> Path | None:
    """The database file of a local SQLite store URI (None for any other store)."""
    return Path(uri[len("sqlite:///"):]) if uri.startswith("sqlite:///") else None


def register_resolvers() -> None:
    # Derived numbers are interpolations (`${k25.mul:2,${model.num_hidden_layers}}`), so
    # changing the model changes every size computed from it.
    for name, fn in {
        "k25.mul": _mul,
        "k25.dtype_bytes": dtype_bytes,
        "k25.project_root": lambda: str(project_root()),
        "k25.slurm_master": slurm_master,
        "k25.communicator": default_communicator,
        "k25.rank_threads": rank_threads,
        "k25.store_uri": store_uri,
    }.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn)


def register_configs() -> None:
    register_resolvers()
    cs = ConfigStore.instance()
    cs.store(name="k25_schema", node=K25Config)
    cs.store(group="model", name="schema", node=ModelConfig)
    cs.store(group="hardware", name="schema", node=HardwareConfig)
    cs.store(group="tracking", name="schema", node=TrackingConfig)
    cs.store(group="server", name="schema", node=ServerConfig)
    for name, node in EXPERIMENT_SCHEMAS.items():
        cs.store(group="schema/experiment", name=name, node=node)
