"""What a run's NVML samples say: figures, a time series per GPU, and two verdicts.

Throttled: a busy GPU's SM clock below its reference (Gpu.sm_ref: the applications clock,
else the max clock) by more than THROTTLE_TOLERANCE. Busy = a kernel ran in the sample's
utilisation window (utilisation > 0) and NVML does not give GpuIdle among its clock event
reasons: an idle GPU lowers its clock on purpose, and NVML says so. On the H200, in a profile
run of tiny_kimi: 669 of 2257 samples read 345 MHz, every one flagged GpuIdle; all 56 with
utilisation 1–29 % read 1980 MHz, the applications clock. Without the reasons (a driver or
binding that lacks them), busy = utilisation ≥ BUSY_UTIL_PCT.
Tolerance 2 %: a clock within 2 % of the reference moves a compute-bound kernel's time by
at most 2 %, below the spread between repeats that the campaign resolves (and a memory-bound
decode kernel's by less); and a reading one or two 15 MHz clock steps below the reference
can be taken while power management steps, with no lasting slowdown. Every busy sample
below counts: the verdict is "yes" from one, and ``throttled_pct`` says how many.

Shared: a compute process NVML lists on a sampled GPU that is not in this job's process
tree (the job, its torchrun ranks, its vLLM server and workers) nor in the served engine's
(server=endpoint on this host: the tree of the process listening on the endpoint's port, the
server the job measures), while visible here. A pid that is not visible here (NVML in a
container reports the host's pids) is unattributed: then the verdict is "unknown", not "no".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

from k25exp.telemetry.nvml_sampler import Sample, SamplerResult

THROTTLE_TOLERANCE = 0.02
BUSY_UTIL_PCT = 50.0
# At most this many points per time series: a long run gets wider windows, not more points.
MAX_POINTS = 1000

# NVML clock event reason bits (nvml.h, nvmlClocksEventReason*)
REASONS = {0x1: "GpuIdle", 0x2: "ApplicationsClocksSetting", 0x4: "SwPowerCap",
           0x8: "HwSlowdown", 0x10: "SyncBoost", 0x20: "SwThermalSlowdown",
           0x40: "HwThermalSlowdown", 0x80: "HwPowerBrakeSlowdown", 0x100: "DisplayClockSetting"}
GPU_IDLE = 0x1

# time-series quantities: Sample attribute → metric name
SERIES = {"sm_mhz": "sm_clock_mhz", "mem_mhz": "mem_clock_mhz", "power_w": "power_w",
          "util_pct": "util_pct", "mem_util_pct": "mem_util_pct", "mem_used_mib": "mem_used_mib",
          "temp_c": "temp_c"}
CSV_COLUMNS = ["t_unix_s", "elapsed_s", "gpu", "sm_clock_mhz", "mem_clock_mhz", "power_w",
               "util_pct", "mem_util_pct", "mem_used_mib", "temp_c", "clock_reasons", "busy",
               "throttled"]
PROCESS_COLUMNS = ["t_unix_s", "gpu", "pid", "used_mib", "ours", "seen_as"]


@dataclass
class TelemetryReport:
    metrics: dict[str, float] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    # (metric key, value, timestamp ms, step = seconds since the first sample)
    series: list[tuple[str, float, int, int]] = field(default_factory=list)
    csv_rows: list[list] = field(default_factory=list)
    process_rows: list[list] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def reason_names(bits: Optional[int]) -> list[str]:
    if not bits:
        return []
    return [n for b, n in REASONS.items() if bits & b] + \
        ([f"0x{bits & ~sum(REASONS):x}"] if bits & ~sum(REASONS) else [])


def is_busy(s: Sample) -> bool:
    if s.util_pct is None:
        return False
    if s.reasons is None:
        return s.util_pct >= BUSY_UTIL_PCT
    return s.util_pct > 0 and not s.reasons & GPU_IDLE


def is_throttled(s: Sample, ref_mhz: Optional[float]) -> bool:
    return (is_busy(s) and ref_mhz is not None and s.sm_mhz is not None
            and s.sm_mhz < ref_mhz * (1.0 - THROTTLE_TOLERANCE))


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def summarize(r: SamplerResult) -> TelemetryReport:
    rep = TelemetryReport()
    refs = {g.index: g.sm_ref for g in r.gpus}
    s = r.samples
    t0 = min((x.t for x in s), default=0.0)
    ticks = sorted({x.t for x in s})
    m = rep.metrics
    m["telemetry.samples"] = float(r.ticks)
    m["telemetry.gpus"] = float(len(r.gpus))
    m["telemetry.period_ms"] = r.period_s * 1e3
    m["telemetry.late_ticks"] = float(r.late_ticks)
    if len(ticks) > 1:
        m["telemetry.interval_ms_mean"] = (ticks[-1] - ticks[0]) / (len(ticks) - 1) * 1e3

    def vals(attr: str, xs=s) -> list[float]:
        return [getattr(x, attr) for x in xs if getattr(x, attr) is not None]

    for attr, key, how in (("power_w", "power_w_mean", _mean), ("power_w", "power_w_max", max),
                           ("util_pct", "util_pct_mean", _mean),
                           ("mem_util_pct", "mem_util_pct_mean", _mean),
                           ("temp_c", "temp_c_max", max)):
        if vals(attr):
            m[f"telemetry.{key}"] = how(vals(attr))
    if vals("mem_used_mib"):
        m["telemetry.mem_used_gib_max"] = max(vals("mem_used_mib")) / 1024
    busy = [x for x in s if is_busy(x)]
    m["telemetry.busy_samples"] = float(len(busy))
    if vals("sm_mhz", busy):
        m["telemetry.sm_clock_busy_min_mhz"] = min(vals("sm_mhz", busy))
        m["telemetry.sm_clock_busy_mean_mhz"] = _mean(vals("sm_mhz", busy))
    if vals("mem_mhz", busy):
        m["telemetry.mem_clock_busy_min_mhz"] = min(vals("mem_mhz", busy))
    known_refs = [v for v, _ in refs.values() if v is not None]
    if known_refs:
        m["telemetry.sm_clock_ref_mhz"] = min(known_refs)
    rep.tags["telemetry.sm_clock_ref"] = one_per_gpu(
        [f"{v:g} MHz ({src})" if v is not None else src for v, src in refs.values()])
    _throttle(rep, r, busy, refs)
    _shared(rep, r)
    rep.series = _series(s, t0)
    for x in s:
        rep.csv_rows.append([f"{x.t:.3f}", f"{x.t - t0:.3f}", x.gpu, *(_cell(getattr(x, a)) for a in SERIES),
                             "|".join(reason_names(x.reasons)) if x.reasons is not None else "",
                             int(is_busy(x)), int(is_throttled(x, refs[x.gpu][0]))])
    measured = r.ours_ever | r.engine_ever  # column "ours": the job's or the served engine's
    for p in r.processes:
        rep.process_rows.append([f"{p.t:.3f}", p.gpu, p.pid, _cell(p.used_mib), int(p.pid in measured),
                                 p.seen_as if p.seen_as is not None else "(not visible here)"])
    if r.errors:
        rep.tags["telemetry.errors"] = "; ".join(f"{k}: {v}" for k, v in sorted(r.errors.items()))[:4000]
    return rep


def _cell(v: Optional[float]) -> str:
    return "" if v is None else f"{v:g}"


def one_per_gpu(vals: list[str]) -> str:
    """One value when every GPU agrees, else each GPU's, by index (envinfo's env.gpu_* tags
    too)."""
    return vals[0] if len(set(vals)) == 1 else "; ".join(f"{i}: {v}" for i, v in enumerate(vals))


def _throttle(rep: TelemetryReport, r: SamplerResult, busy: list[Sample],
              refs: dict[int, tuple[Optional[float], str]]) -> None:
    judged = [x for x in busy if refs[x.gpu][0] is not None and x.sm_mhz is not None]
    if not judged:
        why = "no busy sample" if not busy else "no reference clock or SM clock reading"
        rep.tags["telemetry.throttled"] = f"unknown: {why}"
        return
    low = [x for x in judged if is_throttled(x, refs[x.gpu][0])]
    rep.metrics["telemetry.throttled"] = float(bool(low))
    rep.metrics["telemetry.throttled_pct"] = 100.0 * len(low) / len(judged)
    tol = f"{THROTTLE_TOLERANCE:.0%} tolerance"
    if not low:
        rep.tags["telemetry.throttled"] = (f"no: every one of {len(judged)} busy samples within "
                                           f"{tol} of the reference SM clock")
        return
    parts = []
    for g in r.gpus:
        mine = [x for x in low if x.gpu == g.index]
        if mine:
            ref, src = refs[g.index]
            parts.append(f"GPU {g.index} SM clock down to {min(x.sm_mhz for x in mine):g} MHz "
                         f"under its {src} {ref:g} MHz in {len(mine)} of "
                         f"{sum(x.gpu == g.index for x in judged)} busy samples")
    why = sorted({n for x in low for n in reason_names(x.reasons)} - {"ApplicationsClocksSetting"})
    text = (f"yes ({tol}): " + "; ".join(parts)
            + (f"; NVML reasons: {', '.join(why)}" if why else "; NVML gave no reason"))
    rep.tags["telemetry.throttled"] = text[:4000]
    rep.warnings.append(f"GPU throttled while measuring: {text}")


def _shared(rep: TelemetryReport, r: SamplerResult) -> None:
    foreign: dict[tuple[int, int], tuple[Optional[float], str]] = {}
    unseen: set[int] = set()
    for p in r.processes:
        if p.pid in r.ours_ever or p.pid in r.engine_ever:
            continue
        if p.seen_as is None:
            unseen.add(p.pid)
        else:
            prev = foreign.get((p.gpu, p.pid))
            used = max(filter(None, [p.used_mib, prev[0] if prev else None]), default=None)
            foreign[(p.gpu, p.pid)] = (used, p.seen_as)
    rep.metrics["telemetry.foreign_processes"] = float(len({pid for _, pid in foreign}))
    rep.metrics["telemetry.unattributed_processes"] = float(len(unseen))
    listed = "; ".join(f"GPU {gpu}: pid {pid} ({seen})" + (f" {used / 1024:.1f} GiB" if used else "")
                       for (gpu, pid), (used, seen) in sorted(foreign.items()))
    if unseen:
        # pids from another namespace: a visible pid that is not ours may be a coincidence
        rep.tags["telemetry.gpu_shared"] = (
            f"unknown: pid(s) {', '.join(map(str, sorted(unseen)))} on the GPU are not visible "
            "here (another pid namespace: NVML in a container reports the host's pids)"
            + (f"; visible here but not this job's: {listed}" if listed else ""))[:4000]
    elif foreign:
        rep.metrics["telemetry.gpu_shared"] = 1.0
        rep.tags["telemetry.gpu_shared"] = f"yes: {listed}"[:4000]
        rep.warnings.append(f"GPU shared with another process while measuring: {listed}")
    elif any(k.endswith(".processes") for k in r.errors):
        rep.tags["telemetry.gpu_shared"] = "unknown: NVML did not list the GPU's processes"
    else:
        rep.metrics["telemetry.gpu_shared"] = 0.0
        rep.tags["telemetry.gpu_shared"] = ("no: " + _whose_listed(r) if r.processes
                                            else "no: no compute process listed")
    if r.engine_note is not None and not r.engine_ever and (foreign or unseen):
        rep.tags["telemetry.gpu_shared"] = (rep.tags["telemetry.gpu_shared"] + "; the endpoint's "
                                            f"server, looked for as the served engine: {r.engine_note}")[:4000]


def _whose_listed(r: SamplerResult) -> str:
    """Whose processes were all the GPU's, when none was another's."""
    pids = {p.pid for p in r.processes}
    job, engine = bool(pids & r.ours_ever), bool(pids & r.engine_ever)
    if not engine:
        return "only this job's processes on the GPU"
    served = f" (the endpoint's server: {r.engine_note})"
    if job:
        return f"only this job's and the served engine's processes on the GPU{served}"
    return f"only the served engine's processes on the GPU{served}"


def _series(samples: list[Sample], t0: float) -> list[tuple[str, float, int, int]]:
    """Per GPU and quantity, the mean of each window of whole seconds (wider when the run
    is long, so no series passes MAX_POINTS); step = the window's start, s since t0."""
    if not samples:
        return []
    span = max(x.t for x in samples) - t0
    width = max(1, math.ceil(span / MAX_POINTS))
    acc: dict[tuple[int, int, str], list[float]] = {}
    for x in samples:
        w = int((x.t - t0) // width) * width
        for attr in SERIES:
            v = getattr(x, attr)
            if v is not None:
                acc.setdefault((x.gpu, w, attr), []).append(v)
    return [(f"telemetry/gpu{gpu}/{SERIES[attr]}", _mean(v), int((t0 + w) * 1000), w)
            for (gpu, w, attr), v in sorted(acc.items())]
