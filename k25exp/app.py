"""The Hydra entry point: `python -m k25exp experiment=NAME [overrides]`."""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from k25exp.config import register_configs
from k25exp.config.store import conf_dir

register_configs()


@hydra.main(version_base="1.3", config_path=str(conf_dir()), config_name="config")
def hydra_main(cfg: DictConfig) -> None:
    from k25exp.job import run_job  # imported late: keeps `--help` and `--cfg job` fast

    run_job(cfg)
