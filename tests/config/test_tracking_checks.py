"""The tracking group's rule (a run's heartbeat against the time after which another host
judges it dead) is checked with the rest of the config, before anything runs, and the
multirun's parent run, opened before any job validates, keeps refusing it."""

from __future__ import annotations

import pytest

from k25exp.config.schema import TrackingConfig
from k25exp.config.validate import ConfigError, to_typed
from tests.conftest import compose_cfg

TOO_SOON = ("tracking.stale_after_s=50 must be at least twice tracking.heartbeat_s=30: a run on "
            "another host that beats on time would be judged dead and ended")


def typed(*overrides: str):
    return to_typed(compose_cfg(*overrides), gpu_count=lambda: 0)


@pytest.mark.parametrize("experiment", ["nccl_burst", "macro"])
def test_a_stale_time_under_two_heartbeats_is_a_config_error(experiment):
    with pytest.raises(ConfigError) as e:
        typed(f"experiment={experiment}", "tracking.heartbeat_s=30", "tracking.stale_after_s=50")
    assert str(e.value) == f"invalid config:\n  - {TOO_SOON}"


def test_it_is_listed_with_the_other_problems():
    with pytest.raises(ConfigError) as e:
        typed("experiment=nccl_burst", "hardware.tp=3", "tracking.heartbeat_s=30",
              "tracking.stale_after_s=50")
    assert "hardware.tp=3 must divide" in str(e.value) and TOO_SOON in str(e.value)


@pytest.mark.parametrize("heartbeat,stale", [(30, 60), (0, 1), (30, 900)])
def test_two_heartbeats_or_no_heartbeat_pass(heartbeat, stale):
    # exactly twice is enough; heartbeat 0 = never beats (the pid alone says whether it lives)
    c = typed("experiment=nccl_burst", f"tracking.heartbeat_s={heartbeat}",
              f"tracking.stale_after_s={stale}")
    assert (c.tracking.heartbeat_s, c.tracking.stale_after_s) == (heartbeat, stale)


def test_the_run_a_multirun_opens_before_any_job_validates_refuses_it_too(tmp_path):
    from k25exp.tracking.runs import open_run

    tracking = TrackingConfig(uri=f"sqlite:///{tmp_path}/mlflow.db", heartbeat_s=30,
                              stale_after_s=50)
    with pytest.raises(ValueError) as e:
        open_run(tracking, tmp_path / "sweep", "multirun", {}, role="parent")
    assert str(e.value) == TOO_SOON
    assert not (tmp_path / "mlflow.db").exists()  # refused before the store was opened
