"""Hydra launchers: parallel jobs keep exactly one parent and every child's metrics; the
SLURM launcher config produces the sbatch parameters expected."""

from __future__ import annotations

import os

import pytest
from omegaconf import OmegaConf

from tests.conftest import LIGHT_JOB, LIGHT_METRIC



# joblib's jobs are collective ones: two torchruns at once must each find a port of their own
# (submitit's local jobs run the same way, as processes: the lightest job is enough there).
ALL_TO_ALL = ("experiment=all_to_all", "debug=quick", "experiment.communicator=torch",
              "experiment.ops_per_burst=2,3")
SWEEPS = {"local_parallel": (ALL_TO_ALL, "experiment.ops_per_burst", "a2a_us"),
          "local_submitit": ((*LIGHT_JOB, "experiment.calls=2,3"), "experiment.calls", LIGHT_METRIC)}


@pytest.mark.parametrize("launcher", ["local_parallel", "local_submitit"])
def test_parallel_launchers_lose_no_run(k25, launcher):
    args, swept, metric = SWEEPS[launcher]
    r = k25("-m", f"hydra/launcher={launcher}", *args, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    runs = r.runs()
    parents = [x for x in runs if x.data.tags.get("k25exp.role") == "parent"]
    assert len(parents) == 1
    children = [x for x in runs if x.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id]
    assert len(runs) == 3 and len(children) == 2
    assert sorted(int(c.data.params[swept]) for c in children) == [2, 3]
    assert all(c.info.status == "FINISHED" and metric in c.data.metrics for c in children)
    assert parents[0].data.metrics == {"children": 2.0, "failed_children": 0.0}


def test_slurm_launcher_config_gives_the_sbatch_parameters(tmp_path, monkeypatch):
    import submitit
    from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf

    # submitit refuses to build a SLURM executor without `srun` on PATH. This stand-in (an
    # empty script, named as such) only satisfies that check; nothing is submitted.
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "srun").write_text("#!/bin/sh\nexit 0\n")
    (fake / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("K25EXP_SLURM_ACCOUNT", "perf")

    from hydra import compose, initialize_config_dir

    from tests.conftest import ROOT

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", return_hydra_config=True, overrides=[
            "experiment=nccl_burst", "hydra/launcher=slurm", "hardware=rtx_pro_6000_x8_pcie",
            "hardware.nnodes=2", "hardware.rdzv_endpoint=n0:29500", "hydra.launcher.partition=gpu",
            f"hydra.sweep.dir={tmp_path}/sweep"])
    params = OmegaConf.to_container(cfg.hydra.launcher, resolve=True)
    assert params.pop("_target_").endswith("SlurmLauncher")
    # the mapping hydra-submitit-launcher's launch() applies before submitting
    ex = submitit.AutoExecutor(folder=params.pop("submitit_folder"), cluster="slurm",
                               slurm_max_num_timeout=params.pop("max_num_timeout"))
    base = set(OmegaConf.structured(BaseQueueConf).keys())
    ex.update_parameters(**{k if k in base else f"slurm_{k}": v for k, v in params.items()})
    sbatch = ex._executor._make_submission_file_text("python -m k25exp", "uid")
    for line in ("--partition=gpu", "--account=perf", "--nodes=2", "--gpus-per-node=8",
                 "--ntasks-per-node=1", "--time=60", "--job-name=k25exp"):
        assert f"#SBATCH {line}" in sbatch, line
    assert params["array_parallelism"] == 4


def test_local_parallel_composes_with_joblib():
    from hydra import compose, initialize_config_dir

    from tests.conftest import ROOT

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", return_hydra_config=True,
                      overrides=["experiment=nccl_burst", "hydra/launcher=local_parallel"])
    assert cfg.hydra.launcher._target_.endswith("JoblibLauncher") and cfg.hydra.launcher.n_jobs == 2
