"""The job's telemetry hook (k25exp.tracking.telemetry): started from the composed config,
stopped and logged on success and failure alike, nothing at all on a CPU box; and the
timed points reaching a real MLflow store and an offline run with their own timestamps."""

from __future__ import annotations

import csv
import json
import time

import pytest

from k25exp.config.validate import to_typed
from k25exp.tracking import telemetry
from k25exp.tracking.offline import METRICS_FILE, OfflineRun
from k25exp.tracking.recorder import MemoryRecorder
from k25exp.tracking.telemetry import gpu_telemetry
from tests.conftest import LIGHT_JOB, compose_cfg
from tests.telemetry.fake_nvml import FakeGpu, FakeNvml


def cfg(*overrides: str):
    return to_typed(compose_cfg("experiment=gemm", "hardware=h200_x1", *overrides), gpu_count=lambda: 1)


class Untouchable:
    """Fails the test if anything reads NVML: a CPU run must not."""

    def __getattr__(self, name):
        raise AssertionError(f"NVML touched on a CPU run: {name}")


def test_a_failing_runner_still_stops_and_logs(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    # h200_x1: nproc_per_node = 1, so GPU 1 of this box is not sampled
    nvml = FakeNvml([FakeGpu(sm=1700, util=100, reasons=0x4), FakeGpu()])
    rec = MemoryRecorder()
    with pytest.raises(RuntimeError, match="runner broke"):
        with gpu_telemetry(cfg("hardware.telemetry_period_ms=20"), tmp_path, rec, nvml=nvml) as s:
            time.sleep(0.15)
            raise RuntimeError("runner broke")
    assert not s._thread.is_alive()
    assert nvml.inits == nvml.shutdowns == 2  # the GPU probe and the sampler, both closed
    rows = list(csv.reader(open(tmp_path / "telemetry.csv")))
    assert rows[0][:4] == ["t_unix_s", "elapsed_s", "gpu", "sm_clock_mhz"]
    assert len(rows) - 1 == s.ticks >= 3 and {r[2] for r in rows[1:]} == {"0"}
    assert (tmp_path / "telemetry_processes.csv").exists()
    assert rec.tags["telemetry"] == (f"nvml (fake) every 20 ms on GPU 0 (NVIDIA H200); "
                                     f"all GPUs visible; {s.ticks} ticks")
    # 1700 < 1980 x 0.98 in every busy sample
    assert rec.tags["telemetry.throttled"].startswith("yes (2% tolerance): GPU 0 SM clock down to 1700 MHz")
    logged = {k: v for k, v, _ in rec.metrics}
    assert logged["telemetry.throttled"] == 1 and logged["telemetry.throttled_pct"] == 100
    assert logged["telemetry.samples"] == s.ticks
    assert {k for k, *_ in rec.timed} >= {"telemetry/gpu0/sm_clock_mhz", "telemetry/gpu0/power_w"}
    assert all(v == 1700 for k, v, *_ in rec.timed if k == "telemetry/gpu0/sm_clock_mhz")


def test_cpu_run_costs_nothing(tmp_path):
    rec = MemoryRecorder()
    c = to_typed(compose_cfg("experiment=gemm"), gpu_count=lambda: 0)
    assert c.hardware.device == "cpu"
    with gpu_telemetry(c, tmp_path, rec, nvml=Untouchable()) as s:
        pass
    assert s is None and rec.tags == {"telemetry": "off (hardware.device=cpu)"}
    assert not rec.metrics and not list(tmp_path.iterdir())


@pytest.mark.parametrize("why, setup", [
    ("off (hardware.telemetry_period_ms=0)", lambda mp: ("hardware.telemetry_period_ms=0",)),
    ("unavailable: nvidia-ml-py (pynvml) is not importable here (pip install 'k25exp[gpu]')",
     lambda mp: mp.setattr(telemetry, "_import_nvml", _no_pynvml) or ()),
])
def test_why_nothing_was_sampled_is_a_tag(tmp_path, monkeypatch, why, setup):
    overrides = setup(monkeypatch)
    rec = MemoryRecorder()
    with gpu_telemetry(cfg(*overrides), tmp_path, rec):
        pass
    assert rec.tags == {"telemetry": why}


def _no_pynvml():
    raise ImportError("No module named 'pynvml'")


def test_no_driver_is_a_tag_and_the_body_still_runs(tmp_path):
    rec = MemoryRecorder()
    ran = []
    with gpu_telemetry(cfg(), tmp_path, rec, nvml=FakeNvml([], init_error=OSError("libnvidia-ml.so.1"))):
        ran.append(1)
    assert ran and rec.tags["telemetry"] == "unavailable: NVML failed: OSError: libnvidia-ml.so.1"


def test_report_measures_nothing(tmp_path):
    rec = MemoryRecorder()
    c = to_typed(compose_cfg("experiment=report", "hardware=h200_x1", "experiment.tracking_uri=sqlite:///x.db"),
                 gpu_count=lambda: 1)
    with gpu_telemetry(c, tmp_path, rec, nvml=Untouchable()):
        pass
    assert rec.tags == {"telemetry": "off (report measures nothing)"}


def test_timed_points_keep_their_time_in_mlflow_and_offline(tmp_path):
    from k25exp.tracking.mlflow_store import MlflowStore

    points = [("telemetry/gpu0/power_w", 512.5, 1_000_000, 0), ("telemetry/gpu0/power_w", 640.0, 1_001_000, 1)]
    store = MlflowStore(f"sqlite:///{tmp_path}/m.db", str(tmp_path / "art"))
    run = store.start_run("k25exp/test")
    run.log_timed(points)
    run.end()
    hist = store.client.get_metric_history(run.run_id, "telemetry/gpu0/power_w")
    assert sorted((h.value, h.timestamp, h.step) for h in hist) == [(512.5, 1_000_000, 0), (640.0, 1_001_000, 1)]
    off = OfflineRun(tmp_path / "off", "k25exp/test")
    off.log_timed(points)
    off.end()
    lines = [json.loads(x) for x in (tmp_path / "off" / METRICS_FILE).read_text().splitlines()]
    assert lines == [list(p) for p in points]


def test_a_cpu_job_says_telemetry_is_off(k25):
    # the hook in k25exp/job.py, end to end: the real CLI and store, a CPU box
    r = k25(*LIGHT_JOB)
    assert r.returncode == 0, r.stderr[-3000:]
    (run,) = r.runs()
    assert run.data.tags["telemetry"] == "off (hardware.device=cpu)"
    assert not [k for k in run.data.metrics if k.startswith("telemetry")]
    assert not list(r.outputs.glob("runs/*/*/telemetry.csv"))
