"""An experiment is one unit: its schema class holds its checks, names its runner, says how its
figures are recovered and where its samples are; and adding one is what docs/layout.md says (a
runner module, a schema class, a YAML file; nothing else names it)."""

from __future__ import annotations

import sys
import textwrap
from dataclasses import dataclass
from typing import ClassVar, Optional

import pytest
from hydra.utils import get_method

from k25exp.compare.samples import source, why_no_samples
from k25exp.config import campaign
from k25exp.config.experiments import EXPERIMENT_SCHEMAS, ExperimentBase, experiment
from k25exp.config.store import register_configs
from k25exp.config.validate import ConfigError, to_typed
from k25exp.runners import runner_for
from k25exp.tracking import MemoryRecorder
from k25exp.tracking.recover import recompute
from tests.conftest import compose_cfg


@pytest.mark.parametrize("name", sorted(EXPERIMENT_SCHEMAS))
def test_every_registered_experiment_has_every_hook(name):
    schema = EXPERIMENT_SCHEMAS[name]
    assert schema.missing_hooks() == []
    assert callable(get_method(schema.__dataclass_fields__["_target_"].default))
    # a recovery function that imports, or a reason there is none; the same for samples
    assert callable(get_method(schema.recover)) if schema.recover else schema.no_recovery
    if schema.samples:
        assert callable(get_method(schema.samples)) and schema.sample_artifacts
        assert source(name) is not None
    else:
        assert schema.no_samples and why_no_samples(name, "x", False) == schema.no_samples


def test_a_schema_without_a_hook_is_caught():
    @dataclass
    class Half(ExperimentBase):
        """No recovery said, no samples said."""

        name: str = "half"
        _target_: str = "somewhere.run"

    assert Half.missing_hooks() == ["recover or no_recovery",
                                    "samples + sample_artifacts, or no_samples"]


RUNNER = '''
    def run(cfg, out_dir, recorder):
        recorder.log_metrics({"size_squared": cfg.experiment.size ** 2})
        (out_dir / "note.txt").write_text("measured")
        return {"size_squared": cfg.experiment.size ** 2}
'''


@pytest.fixture
def my_exp(tmp_path, monkeypatch):
    """docs/layout.md's "Adding an experiment", followed word for word in a scratch folder: a
    runner module, a schema class decorated @experiment, conf/experiment/my_exp.yaml with
    the schema's defaults line and only the deltas (found through hydra.searchpath)."""
    (tmp_path / "my_exp_runner.py").write_text(textwrap.dedent(RUNNER))
    monkeypatch.syspath_prepend(str(tmp_path))

    @experiment
    @dataclass
    class MyExpConfig(ExperimentBase):
        """What it measures."""

        campaign_order: ClassVar[Optional[int]] = 9
        campaign_sweep: ClassVar[str] = "experiment.size=1,2,4"
        headline: ClassVar[tuple[str, ...]] = ("size_squared",)
        no_recovery: ClassVar[str] = "my_exp: nothing to recompute"
        no_samples: ClassVar[str] = "no samples (one number)"

        name: str = "my_exp"
        _target_: str = "my_exp_runner.run"
        size: int = 1

        def check(self, cfg, problems):
            super().check(cfg, problems)
            if self.size > 100:
                problems.append(f"experiment.size={self.size}: expected at most 100")

    conf = tmp_path / "conf" / "experiment"
    conf.mkdir(parents=True)
    (conf / "my_exp.yaml").write_text("# @package _global_\ndefaults:\n"
                                      "  - /schema/experiment@experiment: my_exp\n  - _self_\n\n"
                                      "experiment:\n  size: 3\n")
    register_configs()
    yield f"hydra.searchpath=[file://{tmp_path / 'conf'}]"
    del EXPERIMENT_SCHEMAS["my_exp"]
    sys.modules.pop("my_exp_runner", None)


def test_adding_an_experiment_is_one_yaml_one_schema_one_runner(my_exp, tmp_path):
    cfg = to_typed(compose_cfg("experiment=my_exp", my_exp), gpu_count=lambda: 0)
    assert cfg.experiment.size == 3  # the YAML's delta over the schema's default
    rec = MemoryRecorder()
    assert runner_for(cfg.experiment)(cfg, tmp_path, rec) == {"size_squared": 9}
    assert rec.latest("size_squared") == {None: 9}
    # its checks run from its schema
    with pytest.raises(ConfigError, match=r"experiment.size=500: expected at most 100"):
        to_typed(compose_cfg("experiment=my_exp", my_exp, "experiment.size=500"), gpu_count=lambda: 0)
    # the campaign, recovery and compare find it through the registry
    assert campaign.phases()[-2:] == ["report", "my_exp"] and campaign.sweep("my_exp") == "experiment.size=1,2,4"
    assert recompute("my_exp", tmp_path, rec) == ("nothing: my_exp: nothing to recompute; files "
                                                  "uploaded as they are")
    assert why_no_samples("my_exp", "size_squared", False) == "no samples (one number)"
