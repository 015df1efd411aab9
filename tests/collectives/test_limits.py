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


# A rank stalled past the timeout is a real gloo timeout, not this bug: on the loaded 2-core
# box a rank has kept its peer waiting 1.5 s, 3 s and, twice while the campaign's vLLM profile
# phase ran beside it, past 8 s mid-sweep; no run alone shows it. Such a failure is rerun
# (twice, 20 s apart, to let a burst of load pass); a misapplied timeout fails every attempt,
# and torchrun's wall-clock kill is not rerun.
@pytest.mark.e2e
@pytest.mark.flaky(reruns=2, reruns_delay=20, only_rerun=["Timed out waiting", "Application timeout"])
def test_a_sweep_longer_than_the_process_group_timeout_is_not_killed(tmp_path):
    # Bursts of 4 ops of 64 KiB (2 ranks) against a 3 s timeout: each op is quick, so nothing
    # times out, and nothing else limits the job (no wall-clock limit). 2,400 bursts took
    # 6.5-10 s here (2.7-4.2 ms each, loaded or not) but 1.3 s on a 16-core GPU host, where
    # the sweep would not outlast the timeout: there the bursts are scaled up and the sweep
    # run again, until one lasts longer than the timeout. Every attempt must end unkilled.
    reps, measured_s = 1200, 0.0
    for attempt in range(3):
        pts = [Point(label=i, numel=1 << 14, burst=4, reps=reps, blocking_iters=50) for i in range(2)]
        spec = CollectiveSpec(op="all_reduce", dtype="float32", device="cpu", backend="gloo",
                              points=pts, warmup=1, pg_timeout_s=3.0)
        folder = tmp_path / f"attempt{attempt}"
        out = launch(spec, Topology(nproc_per_node=2), folder)
        assert out.ok and not out.timed_out, (folder / "torchrun.log").read_text()[-6000:]
        files = read_rank_files(folder)
        assert len(files.points) == 2
        measured_s = sum(sum(p.queued_s) + sum(p.blocking_s) for p in files.points) / 2  # per rank
        if measured_s > 3.0:
            break
        reps = int(reps * 5.0 / max(measured_s, 0.1)) + 1
    assert measured_s > 3.0, f"the sweep should outlast the 3 s timeout; measured {measured_s:.2f} s"


@pytest.mark.e2e
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
