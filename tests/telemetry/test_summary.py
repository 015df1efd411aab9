"""The sampler's readings and the verdicts drawn from them, on a scripted FakeNvml (no GPU
here), against figures worked out by hand in each test."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from k25exp.telemetry import procs
from k25exp.telemetry.nvml_sampler import NvmlSampler, job_gpus
from k25exp.telemetry.summary import summarize
from tests.telemetry.fake_nvml import UNSUPPORTED, FakeGpu, FakeNvml

GIB = 2**30


class Clock:
    """Wall-clock readings the sampler takes, one per tick, given in advance."""

    def __init__(self, *times: float):
        self.times = list(times)

    def __call__(self) -> float:
        return self.times.pop(0)


# GPU 0 (applications clock 1980 MHz) and GPU 1 (no applications clock: its max, 1980 MHz),
# four ticks 100 ms apart. Threshold: 1980 × (1 − 2 %) = 1940.4 MHz.
#            sm    util  power W  temp  reasons
SCRIPT = {0: [(1980, 100, 650, 60, 0x0),     # busy, at the reference
              (1950, 95, 700, 62, 0x4),      # busy, 1.5 % low: within tolerance
              (1800, 100, 700, 65, 0x4),     # busy, throttled (SwPowerCap)
              (345, 0, 100, 50, 0x1)],       # idle: a low clock is not throttling
          1: [(1980, 100, 500, 55, 0x0)] * 3 + [(1935, 60, 500, 55, 0x0)]}  # last: throttled


def scripted(proc_lists=None, job_pid=None):
    nvml = FakeNvml([FakeGpu(used_bytes=80 * GIB), FakeGpu(app_clock=UNSUPPORTED, used_bytes=70 * GIB)])
    s = NvmlSampler(nvml, [0, 1], period_s=0.1, procs_every_s=1.0, job_pid=job_pid,
                    clock=Clock(1000.0, 1000.1, 1000.2, 1000.3))
    for tick in range(4):
        for gpu, rows in SCRIPT.items():
            sm, util, power, temp, reasons = rows[tick]
            nvml.gpus[gpu].set(sm=sm, util=util, power_mw=power * 1000, temp=temp, reasons=reasons,
                               procs=(proc_lists or {}).get(gpu, []))
        s.sample_once()
    return nvml, s.stop()


def test_figures_and_throttle_verdict_by_hand():
    nvml, r = scripted()
    rep = summarize(r)
    m = rep.metrics
    assert (nvml.inits, nvml.shutdowns) == (1, 1)
    assert len(r.samples) == 8 and r.ticks == 4
    assert m["telemetry.samples"] == 4 and m["telemetry.gpus"] == 2
    assert m["telemetry.interval_ms_mean"] == pytest.approx(100.0)
    # busy: GPU 0's first three, all four of GPU 1 = 7; throttled: 1800 and 1935 MHz = 2
    assert m["telemetry.busy_samples"] == 7
    assert m["telemetry.throttled"] == 1
    assert m["telemetry.throttled_pct"] == pytest.approx(100 * 2 / 7)
    assert m["telemetry.sm_clock_busy_min_mhz"] == 1800
    assert m["telemetry.sm_clock_busy_mean_mhz"] == pytest.approx((1980 + 1950 + 1800 + 3 * 1980 + 1935) / 7)
    assert m["telemetry.sm_clock_ref_mhz"] == 1980
    assert m["telemetry.power_w_mean"] == pytest.approx((650 + 700 + 700 + 100 + 4 * 500) / 8)  # 518.75
    assert m["telemetry.power_w_max"] == 700
    assert m["telemetry.util_pct_mean"] == pytest.approx((100 + 95 + 100 + 0 + 3 * 100 + 60) / 8)
    assert m["telemetry.temp_c_max"] == 65
    assert m["telemetry.mem_used_gib_max"] == 80
    t = rep.tags["telemetry.throttled"]
    assert t.startswith("yes (2% tolerance): ")
    assert "GPU 0 SM clock down to 1800 MHz under its applications clock 1980 MHz in 1 of 3 busy samples" in t
    assert "GPU 1 SM clock down to 1935 MHz under its max clock 1980 MHz in 1 of 4 busy samples" in t
    assert t.endswith("NVML reasons: SwPowerCap")
    assert rep.tags["telemetry.sm_clock_ref"] == "0: 1980 MHz (applications clock); 1: 1980 MHz (max clock)"
    assert "gpu1.app_clock: NVMLError: Not Supported" in rep.tags["telemetry.errors"]
    assert rep.warnings and "throttled" in rep.warnings[0]


def test_series_are_window_means_with_their_own_time():
    _, r = scripted()
    series = {(k, step): (v, ts) for k, v, ts, step in summarize(r).series}
    # 0.3 s of samples: one window of 1 s starting at t = 1000 s
    assert series[("telemetry/gpu0/sm_clock_mhz", 0)] == (pytest.approx((1980 + 1950 + 1800 + 345) / 4), 1_000_000)
    assert series[("telemetry/gpu1/power_w", 0)] == (pytest.approx(500.0), 1_000_000)
    assert series[("telemetry/gpu0/mem_used_mib", 0)][0] == 80 * 1024
    assert len(series) == 2 * 7  # 2 GPUs x 7 quantities x 1 window


def test_csv_rows_mark_busy_and_throttled_samples():
    _, r = scripted()
    rows = summarize(r).csv_rows
    gpu0 = [row for row in rows if row[2] == 0]
    assert [row[1] for row in gpu0] == ["0.000", "0.100", "0.200", "0.300"]
    assert [(row[3], row[-3], row[-2], row[-1]) for row in gpu0] == [
        ("1980", "", 1, 0), ("1950", "SwPowerCap", 1, 0), ("1800", "SwPowerCap", 1, 1),
        ("345", "GpuIdle", 0, 0)]


def test_unthrottled_run_says_no():
    nvml = FakeNvml([FakeGpu(sm=1965, util=100)])  # one 15 MHz step low: within 2 %
    s = NvmlSampler(nvml, [0], clock=Clock(5.0, 5.1))
    s.sample_once()
    s.sample_once()
    rep = summarize(s.stop())
    assert rep.metrics["telemetry.throttled"] == 0 and rep.metrics["telemetry.throttled_pct"] == 0
    assert rep.tags["telemetry.throttled"].startswith("no: every one of 2 busy samples")
    assert not rep.warnings


@pytest.mark.parametrize("util, reasons, busy", [
    (5, 0x0, True),        # a light load holds the clock: judged
    (5, 0x1, False),       # NVML calls it idle
    (100, 0x1, False),
    (0, 0x0, False),       # no kernel in the window
    (5, None, False),      # no reasons to tell a ramping clock from a held one: ≥ 50 % only
    (60, None, True),
])
def test_what_counts_as_busy(util, reasons, busy):
    nvml = FakeNvml([FakeGpu(sm=1500, util=util, reasons=UNSUPPORTED if reasons is None else reasons)])
    s = NvmlSampler(nvml, [0], clock=Clock(5.0))
    s.sample_once()
    rep = summarize(s.stop())
    assert rep.metrics["telemetry.busy_samples"] == int(busy)
    assert rep.metrics.get("telemetry.throttled") == (1 if busy else None)  # 1500 < 1940.4


def test_idle_run_cannot_say():
    nvml = FakeNvml([FakeGpu(sm=345, util=0, reasons=0x1)])
    s = NvmlSampler(nvml, [0], clock=Clock(5.0))
    s.sample_once()
    rep = summarize(s.stop())
    assert "telemetry.throttled" not in rep.metrics
    assert rep.tags["telemetry.throttled"] == "unknown: no busy sample"


# --- shared GPU ------------------------------------------------------------------------------

@pytest.fixture
def stranger():
    """A live process that is not this test's descendant: started by a shell that exits, so
    it is re-parented away from us. Ended by its pid afterwards."""
    out = subprocess.run(["sh", "-c", "sleep 60 >/dev/null 2>&1 & echo $!"], capture_output=True,
                         text=True, check=True)
    pid = int(out.stdout)
    deadline = time.monotonic() + 5
    while procs.describe(pid) != "sleep 60" and time.monotonic() < deadline:
        time.sleep(0.01)  # the forked shell has not exec'd sleep yet
    yield pid
    try:
        os.kill(pid, 9)
    except ProcessLookupError:
        pass


def unused_pid() -> int:
    pid = 4_000_000
    while Path(f"/proc/{pid}").exists():
        pid += 1
    return pid


def test_only_this_jobs_processes_is_not_shared():
    child = subprocess.Popen(["sleep", "60"])  # a rank or server worker the job started
    try:
        _, r = scripted({0: [(os.getpid(), 2 * GIB), (child.pid, 60 * GIB)]}, job_pid=os.getpid())
    finally:
        child.kill()
        child.wait()
    rep = summarize(r)
    assert child.pid in r.ours_ever and os.getpid() in r.ours_ever
    assert rep.metrics["telemetry.gpu_shared"] == 0 and rep.metrics["telemetry.foreign_processes"] == 0
    assert rep.tags["telemetry.gpu_shared"] == "no: only this job's processes on the GPU"
    assert [row[2:5] for row in rep.process_rows] == [[os.getpid(), "2048", 1], [child.pid, "61440", 1]]


def test_a_process_outside_the_job_tree_shares_the_gpu(stranger):
    assert procs.descends_from(stranger, os.getpid()) is False
    _, r = scripted({1: [(os.getpid(), None), (stranger, 3 * GIB)]}, job_pid=os.getpid())
    rep = summarize(r)
    assert rep.metrics["telemetry.gpu_shared"] == 1 and rep.metrics["telemetry.foreign_processes"] == 1
    assert rep.tags["telemetry.gpu_shared"] == f"yes: GPU 1: pid {stranger} (sleep 60) 3.0 GiB"
    assert any("shared" in w for w in rep.warnings)


def test_a_pid_from_another_namespace_leaves_it_unknown(stranger):
    ghost = unused_pid()
    _, r = scripted({0: [(ghost, GIB), (stranger, GIB)]}, job_pid=os.getpid())
    rep = summarize(r)
    assert "telemetry.gpu_shared" not in rep.metrics
    assert rep.metrics["telemetry.unattributed_processes"] == 1
    tag = rep.tags["telemetry.gpu_shared"]
    assert tag.startswith(f"unknown: pid(s) {ghost} on the GPU are not visible here")
    assert f"visible here but not this job's: GPU 0: pid {stranger}" in tag


def test_processes_are_checked_once_per_period():
    nvml = FakeNvml([FakeGpu(procs=[(os.getpid(), None)])])
    s = NvmlSampler(nvml, [0], procs_every_s=1.0, clock=Clock(0.0, 0.5, 1.0, 1.2, 2.1))
    for _ in range(5):
        s.sample_once()
    assert [p.t for p in s.stop().processes] == [0.0, 1.0, 2.1]


# --- which GPUs, and the thread ----------------------------------------------------------------

def test_job_gpus_follow_cuda_visible_devices():
    nvml = FakeNvml([FakeGpu(uuid=f"GPU-{i}") for i in range(4)])
    assert job_gpus(nvml, 2, None) == ([0, 1], "all GPUs visible")
    assert job_gpus(nvml, 8, None)[0] == [0, 1, 2, 3]
    assert job_gpus(nvml, 2, "3,1,0")[0] == [3, 1]
    assert job_gpus(nvml, 1, "GPU-2")[0] == [2]
    gpus, note = job_gpus(nvml, 2, "7,2")
    assert gpus == [2] and note == "CUDA_VISIBLE_DEVICES=7,2 (not sampled: 7)"
    assert job_gpus(nvml, 1, "")[0] == []


def test_thread_samples_at_its_period_and_stops():
    nvml = FakeNvml([FakeGpu()])
    t0 = time.monotonic()
    s = NvmlSampler(nvml, [0], period_s=0.02).start()
    time.sleep(0.3)
    nvml.gpus[0].set(power_mw=RuntimeError("driver hiccup"))  # one query failing: still sampling
    time.sleep(0.1)
    r = s.stop()
    elapsed = time.monotonic() - t0
    assert not s._thread.is_alive() and nvml.shutdowns == 1
    # never more ticks than periods in the window (one at the start, one at stop); how many
    # fewer is the machine's: a busy one wakes the thread late and the ticks it ate are skipped
    assert 2 <= r.ticks <= 2 + elapsed / 0.02, (r.ticks, elapsed)
    ts = [x.t for x in r.samples]
    assert ts == sorted(ts) and (ts[-1] - ts[0]) / (len(ts) - 1) >= 0.015  # no burst of ticks
    assert r.samples[-1].power_w is None and r.samples[0].power_w == 500
    assert r.errors == {"gpu0.power": "RuntimeError: driver hiccup"}
    n = r.ticks
    time.sleep(0.1)
    assert s.ticks == n  # nothing after stop


def test_ancestry_tells_the_jobs_processes_from_others(stranger):
    # a grandchild, as a vLLM worker is of the job (job → server → worker)
    child = subprocess.Popen(["sh", "-c", "sleep 60 & echo $!; wait"], stdout=subprocess.PIPE, text=True)
    grandchild = int(child.stdout.readline())
    deadline = time.monotonic() + 5
    while procs.describe(grandchild) != "sleep 60" and time.monotonic() < deadline:
        time.sleep(0.01)  # the forked shell has not exec'd sleep yet
    try:
        assert procs.descends_from(os.getpid(), os.getpid()) is True
        assert procs.descends_from(grandchild, os.getpid()) is True
        assert procs.descends_from(grandchild, child.pid) is True
        assert procs.descends_from(child.pid, grandchild) is False
        assert procs.descends_from(stranger, os.getpid()) is False
        assert procs.descends_from(1, os.getpid()) is False
        assert procs.describe(grandchild) == "sleep 60"
    finally:
        os.kill(grandchild, 9)
        child.wait()
    assert procs.descends_from(unused_pid(), os.getpid()) is None
    assert procs.describe(unused_pid()) is None


def test_a_process_that_exits_between_two_reads_is_left_out():
    ghost = unused_pid()
    calls = iter([[(ghost, GIB), (os.getpid(), GIB)], [(os.getpid(), GIB)]])
    nvml = FakeNvml([FakeGpu(procs=lambda: next(calls))])
    s = NvmlSampler(nvml, [0], clock=Clock(0.0))
    s.sample_once()
    rep = summarize(s.stop())
    assert [p.pid for p in s.processes] == [os.getpid()]
    assert rep.metrics["telemetry.gpu_shared"] == 0 and rep.metrics["telemetry.unattributed_processes"] == 0
