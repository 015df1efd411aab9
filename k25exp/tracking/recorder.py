"""The narrow interface runners log through, so they run and test without MLflow."""

from __future__ import annotations

from typing import Iterable, Mapping, Optional, Protocol, Tuple


# A time series point with its own time: (key, value, timestamp in ms since the epoch, step).
TimedPoint = Tuple[str, float, int, int]


class Recorder(Protocol):
    def log_metrics(self, metrics: Mapping[str, float], step: Optional[int] = None) -> None:
        """Summary figures; `step` is the swept quantity when a job sweeps inside itself."""

    def set_tags(self, tags: Mapping[str, str]) -> None:
        """Facts about how and where the figures were measured."""

    def log_timed(self, points: Iterable[TimedPoint]) -> None:
        """Points that carry the time they were taken (telemetry), each at its own time."""


class MemoryRecorder:
    """Keeps everything in memory: tracking=none, and tests of runners without a store."""

    def __init__(self) -> None:
        self.metrics: list[tuple[str, float, Optional[int]]] = []
        self.tags: dict[str, str] = {}
        self.children: list[tuple[str, "MemoryRecorder"]] = []
        self.timed: list[TimedPoint] = []
        self.status = "RUNNING"

    def child(self, run_name: str, tags: Optional[Mapping[str, str]] = None) -> "MemoryRecorder":
        """A nested recorder (MLflow: a child run), kept in `children`."""
        c = MemoryRecorder()
        c.set_tags(tags or {})
        self.children.append((run_name, c))
        return c

    def end(self, status: str = "FINISHED") -> None:
        self.status = status

    def log_metrics(self, metrics: Mapping[str, float], step: Optional[int] = None) -> None:
        self.metrics += [(k, float(v), step) for k, v in metrics.items()]

    def set_tags(self, tags: Mapping[str, str]) -> None:
        self.tags.update({k: str(v) for k, v in tags.items()})

    def log_timed(self, points: Iterable[TimedPoint]) -> None:
        self.timed += [(k, float(v), int(ts), int(step)) for k, v, ts, step in points]

    def latest(self, key: str) -> dict[Optional[int], float]:
        """{step: value} of one metric (the last value logged at each step)."""
        return {s: v for k, v, s in self.metrics if k == key}


class Capture(MemoryRecorder):
    """Logs through `inner` with `prefix` on every metric and tag name, and keeps an
    unprefixed copy: a runner that calls another runner twice (spec_decode: speculative and
    baseline) keeps both sets apart in one run and still reads its figures back."""

    def __init__(self, inner: Recorder, prefix: str = "") -> None:
        super().__init__()
        self.inner = inner
        self.prefix = prefix

    def log_metrics(self, metrics: Mapping[str, float], step: Optional[int] = None) -> None:
        super().log_metrics(metrics, step)
        self.inner.log_metrics({self.prefix + k: v for k, v in metrics.items()}, step)

    def set_tags(self, tags: Mapping[str, str]) -> None:
        super().set_tags(tags)
        self.inner.set_tags({self.prefix + k: v for k, v in tags.items()})

    def log_timed(self, points: Iterable[TimedPoint]) -> None:
        points = list(points)
        super().log_timed(points)
        self.inner.log_timed([(self.prefix + k, v, ts, step) for k, v, ts, step in points])
