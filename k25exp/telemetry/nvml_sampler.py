"""A thread that reads NVML at a fixed period while a job measures.

Per GPU and tick: SM and memory clocks, power, GPU and memory-controller utilisation, memory
used, temperature and NVML's clock event (throttle) reasons. Every ``procs_every_s`` also
the GPU's running compute processes, each told apart by its ancestry (procs.ancestry) as the
job's own, the served engine's (a descendant of ``engine_pids``: the processes listening on the
port of the endpoint the job measures, procs.served_engine) or another's.

``nvml`` is the pynvml module (nvidia-ml-py) or anything with its function names; tests
pass a fake, since no GPU is at hand there. An NVML query a GPU does not support reads as
None (its first error is kept in ``errors``); one tick that fails does not stop the thread.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from k25exp.telemetry import procs

# NVML's enum values (nvml.h; stable across releases), so a fake need not define them.
CLOCK_SM, CLOCK_MEM, TEMPERATURE_GPU = 1, 2, 0

# whose a GPU process is (NvmlSampler._whose), and how the process table names it
JOB, ENGINE, OTHER = "job", "engine", "other"
SEEN_AS = {JOB: "(this job)", ENGINE: "(the served engine)"}


@dataclass
class Gpu:
    index: int  # NVML's index (PCI bus order)
    name: str
    sm_app_mhz: Optional[float]  # the applications clock: what work is set to run at
    sm_max_mhz: Optional[float]
    handle: Any = field(default=None, repr=False)

    @property
    def sm_ref(self) -> tuple[Optional[float], str]:
        """The clock a busy, unthrottled GPU holds at least: the applications clock (boost
        may go above it, up to max, when there is headroom), else the max clock."""
        if self.sm_app_mhz:
            return self.sm_app_mhz, "applications clock"
        if self.sm_max_mhz:
            return self.sm_max_mhz, "max clock"
        return None, "none reported"


@dataclass
class Sample:
    """One GPU at one tick; None = not supported or failed on this GPU."""
    t: float  # wall clock, s since the epoch
    gpu: int
    sm_mhz: Optional[float]
    mem_mhz: Optional[float]
    power_w: Optional[float]
    util_pct: Optional[float]
    mem_util_pct: Optional[float]
    mem_used_mib: Optional[float]
    temp_c: Optional[float]
    reasons: Optional[int]  # NVML clock event reason bits


@dataclass
class GpuProcess:
    """A compute process NVML listed on a GPU at one check."""
    t: float
    gpu: int
    pid: int
    used_mib: Optional[float]
    ours: bool  # the job's process, or the served engine's, is among its ancestors
    # "(this job)", "(the served engine)", another's command line, or None: not visible here
    seen_as: Optional[str]


@dataclass
class SamplerResult:
    gpus: list[Gpu]
    period_s: float
    samples: list[Sample]
    processes: list[GpuProcess]
    ticks: int
    late_ticks: int  # ticks skipped because a tick overran its period
    errors: dict[str, str]
    ours_ever: set[int]  # every GPU process found to be this job's
    engine_ever: set[int] = field(default_factory=set)  # ... to be the served engine's
    engine_note: Optional[str] = None  # the served engine looked for: what was found; None: not


class NvmlSampler:
    def __init__(self, nvml: Any, gpu_indices: list[int], period_s: float = 0.1,
                 procs_every_s: float = 1.0, job_pid: Optional[int] = None,
                 proc_root: Path = Path("/proc"), clock: Callable[[], float] = time.time,
                 engine_pids: frozenset[int] = frozenset(), engine_note: Optional[str] = None):
        if period_s <= 0:
            raise ValueError(f"telemetry period must be > 0 s, got {period_s}")
        self.nvml, self.period_s, self.procs_every_s = nvml, period_s, procs_every_s
        self.job_pid = os.getpid() if job_pid is None else job_pid
        self.proc_root, self.clock = proc_root, clock
        self.engine_pids, self.engine_note = frozenset(engine_pids), engine_note
        self.samples: list[Sample] = []
        self.processes: list[GpuProcess] = []
        self.errors: dict[str, str] = {}
        self.ours_ever: set[int] = set()
        self.engine_ever: set[int] = set()
        self._judged: dict[int, str] = {}  # pid → whose (pids are not reused in a run)
        self._names: dict[int, Optional[str]] = {}
        self.ticks = self.late_ticks = 0
        self.note = ""  # what is sampled, in words (the job's `telemetry` tag)
        self._last_procs: Optional[float] = None
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        nvml.nvmlInit()  # raises when no driver answers: the caller says so in a tag
        try:
            self.gpus = [self._gpu(i) for i in gpu_indices]
        except BaseException:
            nvml.nvmlShutdown()
            raise

    def _gpu(self, index: int) -> Gpu:
        n = self.nvml
        h = n.nvmlDeviceGetHandleByIndex(index)
        name = self._q(f"gpu{index}.name", n.nvmlDeviceGetName, h)
        return Gpu(index, name.decode() if isinstance(name, bytes) else str(name or "?"),
                   self._q(f"gpu{index}.app_clock", n.nvmlDeviceGetApplicationsClock, h, CLOCK_SM),
                   self._q(f"gpu{index}.max_clock", n.nvmlDeviceGetMaxClockInfo, h, CLOCK_SM), h)

    def _q(self, what: str, fn: Callable, *args):
        try:
            return fn(*args)
        except Exception as e:  # NVMLError_NotSupported and kin: this GPU lacks the query
            self.errors.setdefault(what, f"{type(e).__name__}: {e}")
            return None

    def _reasons(self, g: Gpu) -> Optional[int]:
        # renamed "clocks event reasons" in NVML 12.5; older bindings have only the old name
        fn = getattr(self.nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            getattr(self.nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
        return self._q(f"gpu{g.index}.reasons", fn, g.handle) if fn else None

    def sample_once(self) -> None:
        """One tick: every GPU's readings, and the processes when they are due."""
        n, t = self.nvml, self.clock()
        for g in self.gpus:
            h, p = g.handle, f"gpu{g.index}."
            power = self._q(p + "power", n.nvmlDeviceGetPowerUsage, h)  # mW
            util = self._q(p + "util", n.nvmlDeviceGetUtilizationRates, h)
            mem = self._q(p + "memory", n.nvmlDeviceGetMemoryInfo, h)
            self.samples.append(Sample(
                t, g.index,
                self._q(p + "sm_clock", n.nvmlDeviceGetClockInfo, h, CLOCK_SM),
                self._q(p + "mem_clock", n.nvmlDeviceGetClockInfo, h, CLOCK_MEM),
                power / 1000.0 if power is not None else None,
                util.gpu if util is not None else None,
                util.memory if util is not None else None,
                mem.used / 2**20 if mem is not None else None,
                self._q(p + "temperature", n.nvmlDeviceGetTemperature, h, TEMPERATURE_GPU),
                self._reasons(g)))
        self.ticks += 1
        if self._last_procs is None or t - self._last_procs >= self.procs_every_s:
            self._last_procs = t
            self.check_processes(t)

    def _list(self, g: Gpu) -> list:
        return self._q(f"gpu{g.index}.processes", self.nvml.nvmlDeviceGetComputeRunningProcesses,
                       g.handle) or []

    def _whose(self, pid: int) -> Optional[str]:
        """JOB (the job process is an ancestor), ENGINE (one of engine_pids is), OTHER, or None:
        not visible here."""
        chain = procs.ancestry(pid, self.proc_root)
        if chain is None:
            return None
        if self.job_pid in chain:
            return JOB
        return ENGINE if self.engine_pids.intersection(chain) else OTHER

    def check_processes(self, t: float) -> None:
        """Each GPU's compute processes, each judged once by its ancestry: the job's, the
        served engine's, another's (visible here, neither), or unattributed (not visible here).
        One that is unseen but gone from NVML's list when asked again exited between the two
        reads: left out, as it can be judged neither way."""
        for g in self.gpus:
            listed = self._list(g)
            unseen = set()
            for p in listed:
                pid = int(p.pid)
                if pid not in self._judged:
                    whose = self._whose(pid)
                    if whose is None:
                        unseen.add(pid)  # judged again at the next check
                    else:
                        self._judged[pid] = whose
            if unseen:
                still = {int(p.pid) for p in self._list(g)}
                listed = [p for p in listed if int(p.pid) not in unseen - still]
            for p in listed:
                pid = int(p.pid)
                whose = self._judged.get(pid)
                if whose == JOB:
                    self.ours_ever.add(pid)
                elif whose == ENGINE:
                    self.engine_ever.add(pid)
                elif whose == OTHER and self._names.get(pid) is None:
                    self._names[pid] = procs.describe(pid, self.proc_root)
                used = getattr(p, "usedGpuMemory", None)
                self.processes.append(GpuProcess(
                    t, g.index, pid, used / 2**20 if isinstance(used, int) else None,
                    whose in (JOB, ENGINE), SEEN_AS.get(whose) or self._names.get(pid)))

    def _run(self) -> None:
        next_t = time.monotonic()
        while not self._stop.is_set():
            try:
                self.sample_once()
            except Exception as e:  # keep sampling; the error is reported with the results
                self.errors.setdefault("tick", f"{type(e).__name__}: {e}")
            next_t += self.period_s
            behind = time.monotonic() - next_t
            if behind > 0:  # a slow tick: skip the ticks it ate instead of bursting
                missed = int(behind // self.period_s) + 1
                self.late_ticks += missed
                next_t += missed * self.period_s
            self._stop.wait(max(0.0, next_t - time.monotonic()))

    def start(self) -> "NvmlSampler":
        self._thread = threading.Thread(target=self._run, name="k25exp-nvml", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> SamplerResult:
        """Stop the thread (it finishes its tick), shut NVML down, return what was read."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10 * self.period_s + 5)
            if self._thread.is_alive():
                self.errors.setdefault("stop", "the sampler thread did not stop (an NVML call hung)")
        try:
            self.nvml.nvmlShutdown()
        except Exception as e:
            self.errors.setdefault("shutdown", f"{type(e).__name__}: {e}")
        return SamplerResult(self.gpus, self.period_s, list(self.samples), list(self.processes),
                             self.ticks, self.late_ticks, dict(self.errors), set(self.ours_ever),
                             set(self.engine_ever), self.engine_note)


def job_gpus(nvml: Any, count: int, visible: Optional[str]) -> tuple[list[int], str]:
    """NVML indices of the first ``count`` GPUs this job's processes see, and a note.

    ``visible`` is CUDA_VISIBLE_DEVICES (None: unset = every GPU, in order). Entries are
    CUDA indices or GPU UUIDs. A CUDA index is taken as the NVML index: CUDA's default
    order (fastest first, ties by PCI bus) is NVML's PCI order on a box of identical GPUs;
    set CUDA_DEVICE_ORDER=PCI_BUS_ID on a mixed one. MIG instances are not sampled.
    """
    total = nvml.nvmlDeviceGetCount()
    if visible is None:
        return list(range(min(count, total))), "all GPUs visible"
    out, skipped = [], []
    for entry in (e.strip() for e in visible.split(",")):
        if not entry:
            continue
        if entry.isdigit():
            if int(entry) >= total:
                skipped.append(entry)
                continue
            out.append(int(entry))
        elif entry.startswith("GPU-"):
            try:
                out.append(nvml.nvmlDeviceGetIndex(nvml.nvmlDeviceGetHandleByUUID(entry)))
            except Exception:
                skipped.append(entry)
        else:  # MIG-… or something CUDA would reject too; CUDA stops at the first bad entry
            skipped.append(entry)
            break
        if len(out) == count:
            break
    note = f"CUDA_VISIBLE_DEVICES={visible}"
    return out, note + (f" (not sampled: {', '.join(skipped)})" if skipped else "")
