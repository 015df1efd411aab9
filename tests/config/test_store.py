"""Resolvers the YAML files use."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from k25exp.config.store import first_host, register_resolvers


@pytest.mark.parametrize("nodelist,host", [
    ("gpu[03-05,9],cpu1", "gpu03"), ("node7", "node7"), ("a,b", "a"), ("dgx-[1-2]", "dgx-1")])
def test_first_host_of_a_slurm_nodelist(nodelist, host):
    assert first_host(nodelist) == host


def test_slurm_master_resolver(monkeypatch):
    register_resolvers()
    cfg = OmegaConf.create({"ep": "${k25.slurm_master:29600}"})
    monkeypatch.setenv("SLURM_JOB_NODELIST", "h100-[12-13]")
    assert cfg.ep == "h100-12:29600"
    monkeypatch.delenv("SLURM_JOB_NODELIST")
    monkeypatch.delenv("SLURM_NODELIST", raising=False)
    with pytest.raises(Exception, match="not inside a SLURM job"):
        _ = cfg.ep
