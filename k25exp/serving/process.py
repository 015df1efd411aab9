"""One launched server process: start it, wait until it serves, stop it with its whole tree.

The child runs in its own process group (stopped as a group) but in this process's session:
Linux puts each session in its own scheduling group (autogroup), and a server in a session
of its own, whose TP workers busy-poll every core of a CPU box, starved the client's
session for up to 1.2 s at a time (kernel 6.18, 2 cores: every open-loop level flagged for
client lag and delivery stalls; in one session, none). From an argument list, stdout and
stderr in a log file whose header (argv, added env) has secrets masked. It is ready when
``GET /health`` answers 200 and ``GET /v1/models`` lists the served name; if it exits first,
or the timeout passes, the error carries the log's last lines. There is no check-then-bind of
the port: vLLM binds it itself early, and a server that exits because the port is taken is
reported as PortInUse naming the port (server.port=0: another free port, a few times).
The child also gets PR_SET_PDEATHSIG, so even a SIGKILL of this process stops the server.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Optional

import httpx
import psutil

from k25exp.poll import PollTimeout, wait_until
from k25exp.redact import scrub
from k25exp.serving.answers import model_ids
from k25exp.serving.errors import PortInUse, ServerError, ServerStartError
from k25exp.serving.launch import LaunchSpec, auth_headers
from k25exp.serving.ports import free_port, listeners, port_owner

log = logging.getLogger(__name__)

LOG_TAIL_LINES = 40
STARTUP_STOP_GRACE_S = 3.0
FREE_PORT_TRIES = 5  # server.port=0: ports picked, then taken by someone else before the bind
_IN_USE = re.compile(r"address already in use", re.I)


def _live(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE  # is_running: same process
    except psutil.Error:
        return False


def process_tree(root: int) -> dict[int, psutil.Process]:
    """Live processes of `root`'s tree and of its process group (children that were
    re-parented after their parent died are still in it)."""
    found: dict[int, psutil.Process] = {}
    try:
        r = psutil.Process(root)
        found = {p.pid: p for p in [r, *r.children(recursive=True)]}
    except psutil.Error:
        pass
    for p in psutil.process_iter():
        try:
            if p.pid not in found and os.getpgid(p.pid) == root:
                found[p.pid] = p
        except OSError:
            pass
    return {pid: p for pid, p in found.items() if _live(p)}


def _child_setup() -> None:  # runs in the child between fork and exec
    os.setpgid(0, 0)  # its own process group, in this session (see the module's docstring)
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:
        pass


@contextlib.contextmanager
def stop_signals_held():
    """Holds Ctrl-C and SIGTERM / SIGHUP inside the block and delivers them on leaving it: a
    stop that landed inside `Popen` (the child already running, its pid not yet ours) left the
    server, and the workers it went on to start, running with no one to stop them; delivered
    once `proc` is set, it stops them like any stop during the start. Handlers can only be
    swapped in the main thread: elsewhere nothing is held."""
    pending: list[int] = []
    saved = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(sig) is not None:  # None: set outside Python, not restorable
                saved[sig] = signal.signal(sig, lambda signum, _f: pending.append(signum))
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
        for sig in dict.fromkeys(pending):  # each once, in the order they came
            signal.raise_signal(sig)


class ManagedServer:
    def __init__(self, spec: LaunchSpec):
        self.spec = spec
        self.key = spec.key()
        self.port = spec.port
        self.proc: Optional[subprocess.Popen] = None
        self.log_path: Optional[Path] = None
        self.start_s: Optional[float] = None
        self.started_at: Optional[float] = None
        self.known: dict[int, psutil.Process] = {}  # every process seen in its tree
        self.stopped = False

    @property
    def base_url(self) -> str:
        host = f"[{self.spec.host}]" if ":" in self.spec.host else self.spec.host
        return f"http://{host}:{self.port}"

    @property
    def pid(self) -> Optional[int]:
        return self.proc.pid if self.proc else None

    def start(self) -> "ManagedServer":
        if not Path(self.spec.model_path).exists():
            raise ServerStartError(f"model path {self.spec.model_path} does not exist")
        if self.spec.port != 0:
            return self._launch(self.spec.port)
        try:
            return wait_until(lambda: self._launch(free_port(self.spec.host)), None, 0.0,
                              "a free port for server.port=0", attempts=FREE_PORT_TRIES,
                              retry_on=(PortInUse,))
        except PollTimeout as e:
            raise ServerStartError(f"{e} (each was taken before vLLM could bind it)") from None

    def _launch(self, port: int) -> "ManagedServer":
        spec = self.spec
        self.port, self.stopped, self.known, self.proc = port, False, {}, None
        argv = list(spec.argv)
        argv[argv.index("--port") + 1] = str(port)
        spec.log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = spec.log_dir / f"vllm-{time.strftime('%Y%m%d-%H%M%S')}-{self.key[:8]}-{port}.log"
        try:
            with open(self.log_path, "wb") as logf:
                logf.write(spec.describe(argv).encode())
                logf.flush()
                t0 = time.perf_counter()
                self.started_at = time.time()
                with stop_signals_held():  # a stop landing inside Popen acts once proc is set
                    self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=logf,
                                                 stderr=subprocess.STDOUT, env=spec.child_env(),
                                                 preexec_fn=_child_setup,
                                                 close_fds=True)
            log.info("vLLM starting (pid %d, port %d, log %s)", self.proc.pid, port, self.log_path)
            self._wait_ready()
        except BaseException as e:
            # Not ready yet: nothing worth a graceful shutdown (and vLLM half-way through its
            # start can sit on SIGTERM for the whole timeout); never created: nothing to stop.
            self.stop(grace_s=STARTUP_STOP_GRACE_S)
            if isinstance(e, ServerError):
                e.log_path = self.log_path  # the runner keeps it as an artifact
            raise
        self.start_s = time.perf_counter() - t0
        self.remember_tree()
        log.info("vLLM ready in %.1f s at %s", self.start_s, self.base_url)
        return self

    def _exited_error(self) -> ServerStartError:
        tail = self.log_tail()
        if _IN_USE.search(tail):
            owner = port_owner(self.port)
            return PortInUse(
                f"port {self.port} on {self.spec.host} is already in use"
                f"{' by ' + owner if owner else ''}: vLLM could not bind it and exited with code "
                f"{self.proc.returncode}; choose another with server.port=N (0 = any free port), "
                f"stop that process, or attach to it with server=endpoint "
                f"server.base_url={self.base_url}", self.port)
        return ServerStartError(f"vLLM exited with code {self.proc.returncode} before it was "
                                f"ready (log {self.log_path}); last lines:\n{tail}")

    def _wait_ready(self) -> None:
        headers = auth_headers(self.spec.secret_env.get("VLLM_API_KEY"))
        with httpx.Client(base_url=self.base_url, timeout=5.0, headers=headers) as c:
            def ready() -> bool:
                if self.proc.poll() is not None:
                    raise self._exited_error()
                self.remember_tree()
                owners = listeners(self.port)
                if owners and not owners & self.pids():
                    return False  # someone else's port: never ask them; ours will exit (in use)
                if c.get("/health").status_code != 200:
                    return False
                r = c.get("/v1/models")
                if r.status_code != 200:
                    return False
                names = model_ids(r)
                if self.spec.served_model_name not in names:
                    raise ServerStartError(f"vLLM serves {names}, not {self.spec.served_model_name!r}")
                return True

            try:
                wait_until(ready, self.spec.ready_timeout_s, 0.5, "vLLM ready",
                           retry_on=(httpx.TransportError,))
            except PollTimeout:
                raise ServerStartError(
                    f"vLLM not ready after {self.spec.ready_timeout_s:.0f} s "
                    f"(server.ready_timeout_s); log {self.log_path}; last lines:\n"
                    f"{self.log_tail()}") from None

    def remember_tree(self) -> None:
        """Notes every process of the server's tree, to stop even those that left it."""
        if self.proc is not None:
            for pid, p in process_tree(self.proc.pid).items():
                self.known.setdefault(pid, p)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_size(self) -> int:
        try:
            return self.log_path.stat().st_size if self.log_path else 0
        except OSError:
            return 0

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        if not self.log_path or not self.log_path.exists():
            return "(no log)"
        with open(self.log_path, "rb") as f:
            f.seek(max(0, self.log_size() - 64 * 1024))
            text = f.read().decode(errors="replace")
        return scrub("\n".join(text.splitlines()[-lines:]), set(self.spec.secret_env.values()))

    def processes(self) -> dict[int, psutil.Process]:
        """Live processes belonging to the server (its session, its tree, those seen before)."""
        if self.proc is None:
            return {}
        self.proc.poll()  # reap it if it exited: a zombie is not alive
        found = process_tree(self.proc.pid)
        found.update({pid: p for pid, p in self.known.items() if pid not in found and _live(p)})
        return found

    def pids(self) -> set[int]:
        return set(self.processes())

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Sends `sig` to the whole server (the fault hook that simulates a crash)."""
        self.remember_tree()
        for p in self.processes().values():
            try:
                p.send_signal(sig)
            except psutil.Error:
                pass

    def stop(self, grace_s: Optional[float] = None) -> None:
        """SIGTERM to every process of the server, SIGKILL to what's left after `grace_s`
        (default: the spec's stop_timeout_s)."""
        if self.proc is None or self.stopped:
            return
        self.stopped = True
        self.remember_tree()
        if self.processes():
            log.info("stopping vLLM (pid %d, %d processes)", self.proc.pid, len(self.processes()))
        self.kill(signal.SIGTERM)
        grace = self.spec.stop_timeout_s if grace_s is None else grace_s
        wait_until(lambda: not self.processes(), grace, 0.1, "vLLM stopped", raise_timeout=False)
        self.kill(signal.SIGKILL)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        wait_until(lambda: not self.processes(), 5, 0.05, "vLLM gone", raise_timeout=False)
