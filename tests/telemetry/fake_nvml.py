"""FakeNvml: a stand-in for the pynvml module (nvidia-ml-py), because no GPU and no NVIDIA
driver exist on the machines these tests run on. It answers the calls k25exp's sampler makes,
with the values a test sets per GPU; the real module is exercised only on a GPU box."""

from __future__ import annotations

from types import SimpleNamespace

UNSUPPORTED = object()  # a query this GPU does not support: raises like NVML's NotSupported


class NVMLError(Exception):
    pass


class FakeGpu:
    def __init__(self, name="NVIDIA H200", app_clock=1980, max_clock=1980, uuid=None, **state):
        self.name, self.app_clock, self.max_clock, self.uuid = name, app_clock, max_clock, uuid
        self.sm, self.mem, self.power_mw, self.util, self.mem_util = 1980, 3201, 500_000, 100, 50
        self.used_bytes, self.temp, self.reasons = 10 * 2**30, 50, 0
        self.procs = []  # [(pid, used bytes)], or a callable returning them per call
        self.set(**state)

    def set(self, **state) -> "FakeGpu":
        for k, v in state.items():
            if not hasattr(self, k):
                raise AttributeError(k)
            setattr(self, k, v)
        return self


def _v(x):
    if x is UNSUPPORTED:
        raise NVMLError("Not Supported")
    if isinstance(x, BaseException):
        raise x
    return x


class FakeNvml:
    NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_TEMPERATURE_GPU = 1, 2, 0
    NVMLError = NVMLError
    __version__ = "fake"

    def __init__(self, gpus: list[FakeGpu], init_error: Exception | None = None):
        self.gpus, self.init_error = gpus, init_error
        self.inits = self.shutdowns = 0

    def nvmlInit(self):
        if self.init_error:
            raise self.init_error
        self.inits += 1

    def nvmlShutdown(self):
        self.shutdowns += 1

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i):
        if not 0 <= i < len(self.gpus):
            raise NVMLError("Invalid Argument")
        return i

    def nvmlDeviceGetHandleByUUID(self, uuid):
        for i, g in enumerate(self.gpus):
            if g.uuid == uuid:
                return i
        raise NVMLError("Not Found")

    def nvmlDeviceGetIndex(self, h):
        return h

    def nvmlDeviceGetName(self, h):
        return self.gpus[h].name

    def nvmlDeviceGetApplicationsClock(self, h, clock):
        assert clock == self.NVML_CLOCK_SM
        return _v(self.gpus[h].app_clock)

    def nvmlDeviceGetMaxClockInfo(self, h, clock):
        assert clock == self.NVML_CLOCK_SM
        return _v(self.gpus[h].max_clock)

    def nvmlDeviceGetClockInfo(self, h, clock):
        g = self.gpus[h]
        return _v(g.sm if clock == self.NVML_CLOCK_SM else g.mem)

    def nvmlDeviceGetPowerUsage(self, h):
        return _v(self.gpus[h].power_mw)

    def nvmlDeviceGetUtilizationRates(self, h):
        g = self.gpus[h]
        return SimpleNamespace(gpu=_v(g.util), memory=_v(g.mem_util))

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(used=_v(self.gpus[h].used_bytes), total=141 * 10**9)

    def nvmlDeviceGetTemperature(self, h, sensor):
        assert sensor == self.NVML_TEMPERATURE_GPU
        return _v(self.gpus[h].temp)

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return _v(self.gpus[h].reasons)

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        procs = self.gpus[h].procs  # a list, or a callable giving each call's list
        procs = procs() if callable(procs) else procs
        return [SimpleNamespace(pid=p, usedGpuMemory=u) for p, u in _v(procs)]
