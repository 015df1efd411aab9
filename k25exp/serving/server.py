"""The vLLM server manager: launch from config, health-check, reuse, stop with every child.

A launched server is a child process in its own session (``start_new_session``), started
from an argument list, with stdout and stderr in a log file. It is ready when ``GET /health``
answers 200 and ``GET /v1/models`` lists the served name; if it exits first, or the timeout
passes, the error carries the log's last lines.

Servers are kept in a module-level registry keyed by a hash of the launch (argument list and
environment), so the jobs of one multirun, which Hydra's basic launcher runs one after another
in this process, share a server while the server config is unchanged; a different config
stops the running one and starts its own. Everything is stopped, process group and all
descendants, when this process exits (atexit), on SIGTERM / SIGHUP (stopped at once, then
the process unwinds as on Ctrl-C), and on Ctrl-C (the KeyboardInterrupt unwinds to atexit). The child also gets PR_SET_PDEATHSIG, so even a SIGKILL
of this process makes the server shut down.
"""

from __future__ import annotations

import atexit
import ctypes
import errno
import hashlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import httpx

from k25exp.config.schema import ModelConfig, ServerConfig

log = logging.getLogger(__name__)

LOG_TAIL_LINES = 40
STARTUP_STOP_GRACE_S = 3.0


class ServerError(RuntimeError):
    """The server could not be started, reached, or kept alive."""


class ServerStartError(ServerError):
    pass


class ServerDied(ServerError):
    pass


# ----------------------------------------------------------------------------------------
# The launch: argument list and environment, from config


@dataclass
class LaunchSpec:
    argv: list[str]
    env: dict[str, str]  # added to os.environ for the child
    host: str
    port: int  # 0 = pick a free one at start
    served_model_name: str
    model_path: str
    log_dir: Path
    ready_timeout_s: float
    stop_timeout_s: float
    api_key_env: Optional[str] = None
    secret_env: dict[str, str] = field(default_factory=dict, repr=False)  # never hashed, never logged

    def key(self) -> str:
        """Identity of the launch: two specs with the same key are the same server."""
        blob = json.dumps({"argv": self.argv, "env": self.env, "api_key_env": self.api_key_env},
                          sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def split_cpus(tp: int, cpus: Optional[list[int]] = None) -> str:
    """VLLM_CPU_OMP_THREADS_BIND giving each of `tp` ranks an equal block of CPUs: '0|1'."""
    cpus = sorted(cpus if cpus is not None else os.sched_getaffinity(0))
    if tp <= 0 or len(cpus) < tp:
        raise ServerError(f"server.tp={tp} needs at least {tp} CPUs for the CPU build, "
                          f"this process may use {len(cpus)}")
    per = len(cpus) // tp
    blocks = [cpus[i * per:(i + 1) * per] for i in range(tp)]
    return "|".join(",".join(map(str, b)) for b in blocks)


def resolve_model_path(server: ServerConfig, model: ModelConfig, seed: int) -> tuple[Path, bool]:
    """The checkpoint folder to serve: server.model_path, or the generated tiny model.

    Returns (path, generated_now). A configured path that doesn't exist is an error here,
    before anything is started.
    """
    if server.model_path:
        p = Path(server.model_path)
        if not p.exists():
            raise ServerStartError(
                f"server.model_path={server.model_path} does not exist; point it at a checkpoint "
                "folder, or set server.model_path=null to generate the model group's tiny "
                "random-weight checkpoint")
        return p, False
    from k25exp.serving import tiny_model

    return tiny_model.ensure(model, seed, Path(server.model_cache))


def launch_spec(server: ServerConfig, model_path: Path, device: str = "cpu") -> LaunchSpec:
    s = server
    py = s.python or sys.executable
    argv = [py, *s.entrypoint, "--model", str(model_path), "--served-model-name",
            s.served_model_name, "--host", s.host, "--port", str(s.port),
            "--tensor-parallel-size", str(s.tp), "--dtype", s.dtype,
            "--max-model-len", str(s.max_model_len), "--seed", str(s.seed)]
    if s.max_num_seqs is not None:
        argv += ["--max-num-seqs", str(s.max_num_seqs)]
    if s.max_num_batched_tokens is not None:
        argv += ["--max-num-batched-tokens", str(s.max_num_batched_tokens)]
    if s.gpu_memory_utilization is not None:
        argv += ["--gpu-memory-utilization", str(s.gpu_memory_utilization)]
    if s.enforce_eager:
        argv.append("--enforce-eager")
    if s.enable_prefix_caching is not None:
        argv.append("--enable-prefix-caching" if s.enable_prefix_caching
                    else "--no-enable-prefix-caching")
    if s.trust_remote_code:
        argv.append("--trust-remote-code")
    if s.tokenizer:
        argv += ["--tokenizer", s.tokenizer]
    if s.profiler:
        argv += ["--profiler-config", json.dumps(dict(s.profiler), sort_keys=True)]
    argv += [str(a) for a in s.extra_args]

    # Dev mode enables POST /reset_prefix_cache (levels must not share cached prefixes).
    env = {"PYTHONUNBUFFERED": "1", "VLLM_SERVER_DEV_MODE": "1"}
    if device == "cpu":
        if s.cpu_kvcache_space_gib is not None:
            env["VLLM_CPU_KVCACHE_SPACE"] = str(s.cpu_kvcache_space_gib)
        if s.cpu_threads_bind == "split":
            env["VLLM_CPU_OMP_THREADS_BIND"] = split_cpus(s.tp)
        elif s.cpu_threads_bind:
            env["VLLM_CPU_OMP_THREADS_BIND"] = s.cpu_threads_bind
    env.update({k: str(v) for k, v in s.env.items()})
    secret = {}
    if s.api_key_env:
        secret["VLLM_API_KEY"] = api_key(s)  # passed by environment: never in argv or ps
    return LaunchSpec(argv=argv, env=env, host=s.host, port=s.port,
                      served_model_name=s.served_model_name, model_path=str(model_path),
                      log_dir=Path(s.log_dir), ready_timeout_s=s.ready_timeout_s,
                      stop_timeout_s=s.stop_timeout_s, api_key_env=s.api_key_env,
                      secret_env=secret)


def api_key(server: ServerConfig) -> Optional[str]:
    """The API key from the environment variable server.api_key_env names (None if unset)."""
    if not server.api_key_env:
        return None
    v = os.environ.get(server.api_key_env)
    if not v:
        raise ServerError(f"server.api_key_env={server.api_key_env}: that environment variable "
                          "is not set")
    return v


def auth_headers(key: Optional[str]) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key else {}


# ----------------------------------------------------------------------------------------
# Ports and processes


def port_owner(port: int) -> str:
    """'pid 123 (cmdline)' of whatever listens on `port`, best effort ('' if unknown)."""
    try:
        import psutil

        for c in psutil.net_connections(kind="tcp"):
            if c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN and c.pid:
                cmd = " ".join(psutil.Process(c.pid).cmdline())[:160]
                return f"pid {c.pid} ({cmd})"
    except Exception:
        pass
    return ""


def check_port_free(host: str, port: int) -> None:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            s.bind((host, port))
        except OSError as e:
            if e.errno != errno.EADDRINUSE:
                raise ServerStartError(f"cannot bind {host}:{port}: {e}") from None
            owner = port_owner(port)
            raise ServerStartError(
                f"port {port} on {host} is already in use{' by ' + owner if owner else ''}; "
                f"choose another with server.port=N (0 = any free port), stop that process, or "
                f"attach to it with server=endpoint server.base_url=http://{host}:{port}") from None


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _stat(pid: int) -> Optional[tuple[int, int, int]]:
    """(ppid, session id, start time) of a live process, from /proc (None if gone)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    rest = raw[raw.rindex(")") + 2:].split()  # the name may hold spaces and parentheses
    if rest[0] == "Z":
        return None
    return int(rest[1]), int(rest[3]), int(rest[19])


def _all_pids() -> list[int]:
    return [int(d) for d in os.listdir("/proc") if d.isdigit()]


def session_pids(sid: int) -> set[int]:
    """Live processes of the session `sid` (what start_new_session gave the server)."""
    out = set()
    for pid in _all_pids():
        st = _stat(pid)
        if st and st[1] == sid:
            out.add(pid)
    return out


def descendants(root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid in _all_pids():
        st = _stat(pid)
        if st:
            children.setdefault(st[0], []).append(pid)
    out, todo = set(), [root]
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in out:
                out.add(c)
                todo.append(c)
    return out


def _set_pdeathsig() -> None:  # runs in the child between fork and exec
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:
        pass


# ----------------------------------------------------------------------------------------
# One launched server


class ManagedServer:
    def __init__(self, spec: LaunchSpec):
        self.spec = spec
        self.key = spec.key()
        self.port = spec.port
        self.proc: Optional[subprocess.Popen] = None
        self.log_path: Optional[Path] = None
        self.start_s: Optional[float] = None
        self.started_at: Optional[float] = None
        self.known: dict[int, int] = {}  # pid -> start time, every process seen in its tree
        self.stopped = False

    @property
    def base_url(self) -> str:
        host = f"[{self.spec.host}]" if ":" in self.spec.host else self.spec.host
        return f"http://{host}:{self.port}"

    @property
    def pid(self) -> Optional[int]:
        return self.proc.pid if self.proc else None

    def start(self) -> "ManagedServer":
        spec = self.spec
        if not Path(spec.model_path).exists():
            raise ServerStartError(f"model path {spec.model_path} does not exist")
        if self.port == 0:
            self.port = free_port(spec.host)
        check_port_free(spec.host, self.port)
        argv = list(spec.argv)
        if spec.port == 0:
            argv[argv.index("--port") + 1] = str(self.port)
        spec.log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = spec.log_dir / f"vllm-{time.strftime('%Y%m%d-%H%M%S')}-{self.key[:8]}-{self.port}.log"
        env = {**os.environ, **spec.env, **spec.secret_env}
        with open(self.log_path, "wb") as logf:
            logf.write(("# k25exp: " + " ".join(argv) + "\n# env: " +
                        " ".join(f"{k}={v}" for k, v in sorted(spec.env.items())) + "\n").encode())
            logf.flush()
            t0 = time.perf_counter()
            self.started_at = time.time()
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=logf,
                                         stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True, preexec_fn=_set_pdeathsig,
                                         close_fds=True)
        _install_handlers()
        log.info("vLLM starting (pid %d, port %d, log %s)", self.proc.pid, self.port, self.log_path)
        try:
            self._wait_ready(t0)
        except BaseException as e:
            # Not ready yet: nothing worth a graceful shutdown (and vLLM half-way through its
            # start can sit on SIGTERM for the whole timeout).
            self.stop(grace_s=STARTUP_STOP_GRACE_S)
            if isinstance(e, ServerError):
                e.log_path = self.log_path  # the runner keeps it as an artifact
            raise
        self.start_s = time.perf_counter() - t0
        self.remember_tree()
        log.info("vLLM ready in %.1f s at %s", self.start_s, self.base_url)
        return self

    def _wait_ready(self, t0: float) -> None:
        deadline = t0 + self.spec.ready_timeout_s
        headers = auth_headers(self.spec.secret_env.get("VLLM_API_KEY"))
        with httpx.Client(base_url=self.base_url, timeout=5.0, headers=headers) as c:
            while True:
                if self.proc.poll() is not None:
                    raise ServerStartError(
                        f"vLLM exited with code {self.proc.returncode} before it was ready "
                        f"(log {self.log_path}); last lines:\n{self.log_tail()}")
                try:
                    if c.get("/health").status_code == 200:
                        r = c.get("/v1/models")
                        names = [m.get("id") for m in r.json().get("data", [])] if r.status_code == 200 else []
                        if self.spec.served_model_name in names:
                            return
                        if r.status_code == 200:
                            raise ServerStartError(f"vLLM serves {names}, not "
                                                   f"{self.spec.served_model_name!r}")
                except httpx.TransportError:
                    pass
                if time.perf_counter() > deadline:
                    raise ServerStartError(
                        f"vLLM not ready after {self.spec.ready_timeout_s:.0f} s "
                        f"(server.ready_timeout_s); log {self.log_path}; last lines:\n{self.log_tail()}")
                self.remember_tree()
                time.sleep(0.5)

    def remember_tree(self) -> None:
        """Notes every process of the server's tree, to stop even those that left it."""
        if self.proc is None:
            return
        for pid in {self.proc.pid} | descendants(self.proc.pid) | session_pids(self.proc.pid):
            st = _stat(pid)
            if st:
                self.known.setdefault(pid, st[2])

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
        return "\n".join(text.splitlines()[-lines:])

    def pids(self) -> set[int]:
        """Live processes belonging to the server (its session, its tree, those seen before)."""
        if self.proc is None:
            return set()
        pids = session_pids(self.proc.pid) | descendants(self.proc.pid)
        if self.proc.poll() is None:
            pids.add(self.proc.pid)
        for pid, start in self.known.items():
            st = _stat(pid)
            if st and st[2] == start:  # same process, not a reused pid
                pids.add(pid)
        return pids

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Sends `sig` to the whole server (the fault hook that simulates a crash)."""
        self.remember_tree()
        for pid in self.pids():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def stop(self, grace_s: Optional[float] = None) -> None:
        """SIGTERM to every process of the server, SIGKILL to what's left after `grace_s`
        (default: the spec's stop_timeout_s)."""
        if self.proc is None or self.stopped:
            return
        self.stopped = True
        self.remember_tree()
        pids = self.pids()
        if pids:
            log.info("stopping vLLM (pid %d, %d processes)", self.proc.pid, len(pids))
        for pid in pids:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + (self.spec.stop_timeout_s if grace_s is None else grace_s)
        while time.monotonic() < deadline:
            self.proc.poll()
            if not self.pids():
                break
            time.sleep(0.1)
        for pid in self.pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        end = time.monotonic() + 5
        while self.pids() and time.monotonic() < end:
            time.sleep(0.05)


# ----------------------------------------------------------------------------------------
# The registry: one server per launch key, reused across the jobs of this process

_servers: dict[str, ManagedServer] = {}
_lock = threading.Lock()
starts: list[tuple[str, float]] = []  # (key, seconds) of every start in this process


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
            _servers.pop(k).stop()
        srv = ManagedServer(spec).start()
        _servers[key] = srv
        starts.append((key, srv.start_s or 0.0))
        return srv, True


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


def _install_handlers() -> None:
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


# ----------------------------------------------------------------------------------------
# Endpoint mode: someone else's server


def wait_endpoint(base_url: str, served_model_name: str, key: Optional[str],
                  timeout_s: float) -> dict:
    """Checks an endpoint answers /health (or /v1/models) and serves the model. Returns info."""
    deadline = time.monotonic() + timeout_s
    last = ""
    with httpx.Client(base_url=base_url, timeout=5.0, headers=auth_headers(key)) as c:
        while True:
            try:
                r = c.get("/v1/models")
                if r.status_code == 200:
                    names = [m.get("id") for m in r.json().get("data", [])]
                    if served_model_name not in names:
                        raise ServerError(f"endpoint {base_url} serves {names}, not "
                                          f"{served_model_name!r} (server.served_model_name)")
                    return {"models": names, **server_version(c)}
                if r.status_code in (401, 403):
                    raise ServerError(f"endpoint {base_url} refused the API key (HTTP {r.status_code}); "
                                      "set server.api_key_env to the variable holding it")
                last = f"HTTP {r.status_code}"
            except httpx.TransportError as e:
                last = f"{type(e).__name__}: {e}"
            if time.monotonic() > deadline:
                raise ServerError(f"endpoint {base_url} unreachable after {timeout_s:.0f} s "
                                  f"(server.ready_timeout_s): {last}")
            time.sleep(0.5)


def server_version(c: httpx.Client) -> dict:
    """{'version': '0.32.0'} from vLLM's GET /version; {} when the server has none."""
    try:
        v = c.get("/version")
        if v.status_code == 200:
            return {"version": str(v.json().get("version", ""))}
    except (httpx.HTTPError, ValueError, AttributeError):
        pass
    return {}


@dataclass
class Connection:
    """What a runner needs to talk to the server, whichever kind."""

    base_url: str
    model: str
    api_key: Optional[str] = field(repr=False, default=None)
    managed: Optional[ManagedServer] = None
    started: bool = False
    start_s: Optional[float] = None
    log_offset: int = 0  # where this job's part of the server log begins
    info: dict = field(default_factory=dict)

    def alive(self) -> bool:
        return self.managed.alive() if self.managed else True

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        return self.managed.log_tail(lines) if self.managed else ""


def connect(server: ServerConfig, model: ModelConfig, seed: int, device: str,
            on_generate: Optional[Callable[[Path], None]] = None) -> Connection:
    """Launches (or reuses) the configured server, or attaches to the endpoint."""
    key = api_key(server)
    if server.kind == "endpoint":
        info = wait_endpoint(server.base_url.rstrip("/"), server.served_model_name, key,
                             server.ready_timeout_s)
        return Connection(server.base_url.rstrip("/"), server.served_model_name, key, info=info)
    if server.kind != "vllm":
        raise ServerError(f"server.kind={server.kind!r}: expected 'vllm' or 'endpoint'")
    path, generated = resolve_model_path(server, model, seed)
    if generated and on_generate:
        on_generate(path)
    spec = launch_spec(server, path, device)
    srv, started = acquire(spec)
    with httpx.Client(base_url=srv.base_url, timeout=5.0) as c:
        version = server_version(c)
    return Connection(srv.base_url, server.served_model_name, key, managed=srv, started=started,
                      start_s=srv.start_s if started else None,
                      log_offset=0 if started else srv.log_size(),
                      info={"pid": srv.pid, "key": srv.key, "model_path": str(path), **version})
