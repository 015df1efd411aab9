"""Where a run's process lives, and whether it still does.

A run killed hard (SIGKILL, the OOM killer, a lost node) never ends itself: MLflow shows it
RUNNING forever. So each run records where it runs — host, pid and the process's start time
(a pid alone may be reused) — and a heartbeat thread refreshes a tag while it is open.
From the same host a run is gone when its pid is dead or now belongs to another process;
from another host, when its heartbeat is older than `tracking.stale_after_s`.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from typing import Mapping, Optional

import psutil

log = logging.getLogger(__name__)

HOST, PID, PID_START, HEARTBEAT = "k25exp.host", "k25exp.pid", "k25exp.pid_start", "k25exp.heartbeat"
# Start times compared with this slack: psutil derives them from boot time + clock ticks.
START_SLACK_S = 1.0


def where_tags(pid: Optional[int] = None) -> dict[str, str]:
    """Tags that let another process tell whether this one still runs."""
    p = psutil.Process(pid or os.getpid())
    return {HOST: socket.gethostname(), PID: str(p.pid), PID_START: f"{p.create_time():.3f}",
            HEARTBEAT: f"{time.time():.3f}"}


def gone_reason(tags: Mapping[str, str], start_time_ms: Optional[int], stale_after_s: float,
                now: Optional[float] = None) -> Optional[str]:
    """Why the run's process is gone, or None while it may still run (or can't be told:
    runs logged before these tags existed are left alone)."""
    if HOST not in tags or PID not in tags:
        return None
    now = time.time() if now is None else now
    host, pid = tags[HOST], int(tags[PID])
    if host == socket.gethostname():
        try:
            p = psutil.Process(pid)
            started, status = p.create_time(), p.status()
        except psutil.NoSuchProcess:
            return f"process {pid} on {host} is not running"
        except psutil.Error as e:  # AccessDenied: someone else's process, so not ours
            return f"process {pid} on {host} can't be inspected ({type(e).__name__}): not the job's"
        want = float(tags.get(PID_START, "nan"))
        if not abs(started - want) <= START_SLACK_S:
            return (f"pid {pid} on {host} now belongs to another process (started "
                    f"{time.strftime('%Y-%m-%dT%H:%M:%S', time.localtime(started))}, the job's at "
                    f"{time.strftime('%Y-%m-%dT%H:%M:%S', time.localtime(want))})")
        if status == psutil.STATUS_ZOMBIE:
            return f"process {pid} on {host} has exited (a zombie, not yet reaped)"
        return None
    beat = float(tags.get(HEARTBEAT) or (start_time_ms or 0) / 1e3)
    if now - beat > stale_after_s:
        return (f"no heartbeat from {host} (pid {pid}) for {now - beat:.0f} s "
                f"(tracking.stale_after_s={stale_after_s:g})")
    return None


class Heartbeat:
    """A daemon thread that refreshes the run's heartbeat tag every `interval_s` and flushes
    its buffered metrics, so a run killed hard keeps what it had logged until then."""

    def __init__(self, run, interval_s: float):
        self.run, self.interval_s = run, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="k25exp-heartbeat", daemon=True)

    def start(self) -> "Heartbeat":
        self._thread.start()
        return self

    def _beat(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.run.set_tags({HEARTBEAT: f"{time.time():.3f}"})
                self.run.flush()
            except Exception as e:  # a busy or full store must not kill the measurement
                log.warning("heartbeat of run %s failed: %s", self.run.run_id, e)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=30)
