"""The two time limits of a collective job are separate: the process group's timeout bounds
one collective's wait for its peers, torchrun's wall-clock limit the whole job."""

from __future__ import annotations

import pytest

from k25exp.collectives.launch import Topology, launch
from k25exp.collectives.results import read_rank_files
from k25exp.collectives.spec import CollectiveSpec, Point
from k25exp.config.validate import ConfigError, to_typed
from k25exp.runners import runner_for
from k25exp.runners.collective import CollectiveFailed
from k25exp.tracking import MemoryRecorder
from tests.conftest import compose_cfg


# A stall of one rank past the timeout is a real gloo timeout, not this bug: on the loaded
# 2-core CI box (a vLLM profile phase beside it, twice) a rank has waited past 8 s mid-sweep,
# which no unloaded run shows. Such a failure is rerun (twice); a timeout that is misapplied
# fails every attempt. Torchrun's wall-clock kill is not rerun.
@pytest.mark.flaky(reruns=2, only_rerun=["Timed out waiting", "Application timeout"])
def test_a_sweep_longer_than_the_process_group_timeout_is_not_killed(tmp_path):
    # ~12 s of collectives (on a 2-core box) against an 8 s process-group timeout: each op is
    # quick, so nothing times out, and nothing else limits the job (no wall-clock limit).
    # Short bursts (4 ops of 64 KiB) in 2 points.
    pts = [Point(label=i, numel=1 << 14, burst=4, reps=3200, blocking_iters=50) for i in range(2)]
    spec = CollectiveSpec(op="all_reduce", dtype="float32", device="cpu", backend="gloo",
                          points=pts, warmup=1, pg_timeout_s=8.0)
    out = launch(spec, Topology(nproc_per_node=2), tmp_path)
    files = read_rank_files(tmp_path)
    measured_s = sum(sum(p.queued_s) + sum(p.blocking_s) for p in files.points) / 2  # per rank
    assert out.ok and not out.timed_out, (tmp_path / "torchrun.log").read_text()[-6000:]
    assert len(files.points) == 2
    assert measured_s > 8.0, f"the sweep should outlast the 8 s timeout; measured {measured_s:.2f} s"


def test_the_wall_clock_limit_kills_the_job_and_names_its_key(tmp_path):
    cfg = to_typed(compose_cfg("experiment=allreduce_sweep", "experiment.communicator=torch",
                               "experiment.wall_limit_s=0.5"), gpu_count=lambda: 0)
    rec = MemoryRecorder()
    with pytest.raises(CollectiveFailed, match=r"experiment\.wall_limit_s=0\.5 s"):
        runner_for(cfg.experiment)(cfg, tmp_path, rec)


def test_limits_are_validated_by_name():
    with pytest.raises(ConfigError, match=r"experiment\.wall_limit_s=0.*null"):
        to_typed(compose_cfg("experiment=nccl_burst", "experiment.wall_limit_s=0"), gpu_count=lambda: 0)
    with pytest.raises(ConfigError, match=r"experiment\.pg_timeout_s=-1"):
        to_typed(compose_cfg("experiment=nccl_burst", "experiment.pg_timeout_s=-1"), gpu_count=lambda: 0)
