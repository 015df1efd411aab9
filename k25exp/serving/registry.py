"""The servers this process runs, one per launch key, and the handlers that stop them.

The jobs of one multirun (Hydra's basic launcher runs them one after another in this process)
share a server while its launch key (argv and environment) is unchanged; another key stops the
running one and starts its own. Everything is stopped, process group and all descendants, when
this process exits (atexit), on SIGTERM / SIGHUP (stopped at once, then the process unwinds as
on Ctrl-C), and on Ctrl-C (the KeyboardInterrupt unwinds to atexit, and a server still
starting stops itself on the way out).
"""

from __future__ import annotations

import atexit
import logging
import signal
import threading

from k25exp.serving.launch import LaunchSpec
from k25exp.serving.process import ManagedServer

log = logging.getLogger(__name__)

_servers: dict[str, ManagedServer] = {}
_lock = threading.Lock()
starts: list[tuple[str, float, int]] = []  # (key, seconds, pid) of every start in this process


def acquire(spec: LaunchSpec) -> tuple[ManagedServer, bool]:
    """The running server for `spec`, started if needed. Returns (server, started_now).

    A running server with another key is stopped first (one server at a time: a second one
    would compete for the same cores or GPUs and distort both).
    """
    key = spec.key()
    with _lock:
        srv = _servers.get(key)
        if srv is not None and srv.alive():
            srv.remember_tree()
            return srv, False
        for k in list(_servers):
            old = _servers.pop(k)
            if old.alive():
                log.warning(restart_line(old.spec, spec))
            old.stop()
        install_handlers()  # before the start: a signal during it must stop the server too
        srv = ManagedServer(spec).start()
        _servers[key] = srv
        starts.append((key, srv.start_s or 0.0, srv.pid))
        return srv, True


def restart_line(old: LaunchSpec, new: LaunchSpec) -> str:
    """The log line when a job's server settings differ from the running server's: what
    changed, and (a context sweep's usual cause) how to keep one start across prompt lengths."""
    diff = new.changes_from(old)
    line = ("restarting the server: its settings changed since it started ("
            + ("; ".join(diff) or "launch key only") + "); jobs of one multirun share one "
            "server only while its settings are unchanged")
    if any(d.startswith("--max-model-len ") for d in diff):
        line += (". A sweep of experiment.input_tokens keeps one server start when "
                 "server.max_model_len is set once, to the longest prompt + output tokens of "
                 "the sweep, not per context")
    return line


def running() -> list[ManagedServer]:
    return [s for s in _servers.values() if s.alive()]


def release(srv: ManagedServer) -> None:
    """Stops and forgets one server (after it died, or when a caller is done with it)."""
    with _lock:
        if _servers.get(srv.key) is srv:
            del _servers[srv.key]
    srv.stop()


def stop_all() -> None:
    for k in list(_servers):
        srv = _servers.pop(k, None)
        if srv is not None:
            srv.stop()


_handlers_installed = False


def install_handlers() -> None:
    """atexit always; SIGTERM / SIGHUP when we are the main thread (signals need it)."""
    global _handlers_installed
    if _handlers_installed:
        return
    _handlers_installed = True
    atexit.register(stop_all)
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGTERM, signal.SIGHUP):
        prev = signal.getsignal(sig)

        def handler(signum, frame, prev=prev):
            stop_all()
            if callable(prev):
                prev(signum, frame)
            else:  # unwind like Ctrl-C: the job ends its MLflow run as KILLED on the way out
                raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")

        signal.signal(sig, handler)
