"""Shared fixtures: compose the real configs, run the real CLI into a temporary store."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from k25exp.config import register_configs
from k25exp.config.store import project_root

ROOT = project_root()
register_configs()


def compose_cfg(*overrides: str):
    """The config `python -m k25exp <overrides>` would run (Hydra's own compose)."""
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose("config", overrides=list(overrides))


@dataclass
class CliResult:
    returncode: int
    stdout: str
    stderr: str
    outputs: Path
    uri: str

    @property
    def client(self):
        from mlflow.tracking import MlflowClient  # lazily: GPU nodes run tests/gemm without MLflow

        return MlflowClient(self.uri)

    def runs(self):
        c = self.client
        ids = [e.experiment_id for e in c.search_experiments()]
        return c.search_runs(ids, order_by=["attributes.start_time ASC"], max_results=1000)


@pytest.fixture
def k25(tmp_path):
    """Runs `python -m k25exp ARGS` with outputs and the MLflow store under tmp_path."""
    return make_k25(tmp_path)


def make_k25(tmp_path: Path):
    """k25's runner for any folder (module-scoped fixtures use it with their own folder)."""
    outputs = tmp_path / "outputs"
    uri = f"sqlite:///{outputs}/mlflow.db"
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "K25EXP_CAMPAIGN")}

    def run(*args: str, timeout: float = 300) -> CliResult:
        p = subprocess.run([sys.executable, "-m", "k25exp", *args, f"paths.outputs={outputs}"],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        return CliResult(p.returncode, p.stdout, p.stderr, outputs, uri)

    return run
