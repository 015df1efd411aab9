"""A warm Python for the tests' job processes (test infrastructure, named as such).

Every `python -m k25exp ...` a test starts spends ~4 s of CPU importing torch, MLflow, Hydra
and transformers before the job begins; the suite starts ~60 of them on a 2-core box. Here one
server process per pytest worker imports those libraries once, then forks a process per job:

    python -m tests.warm_python --serve SOCKET          # the server (tests/conftest.py starts it)
    python tests/warm_python.py SOCKET -m k25exp ARGS   # a job, as `python -m k25exp ARGS` would run

The job is still a process of its own, running k25exp's real entry point from the top: k25exp
itself is imported in the fork, never in the server, so its import-time code runs per job.
It ends as the interpreter ends (threads joined, atexit handlers, streams flushed) without
tearing the preloaded modules down. The
client hands the job its own stdin, stdout and stderr (the file descriptors themselves), its
working directory, environment and CPU affinity (`taskset -c 0` pins the job), forwards
SIGINT and SIGTERM, and exits with the job's code;
if the client dies, the job is killed. What differs from a fresh interpreter: the preloaded
libraries read their import-time environment once, in the server (none that k25exp's tests set
per job), and numpy's global random state is the server's (k25exp seeds its own generators).
The tests also give it to k25exp as $K25EXP_PYTHON, the Python torchrun and its ranks run
with: a collective job then starts no cold interpreter at all. Tests whose subject is the
process itself (signals, kills, process groups, resource limits) start fresh interpreters instead.
"""

from __future__ import annotations

import atexit
import json
import os
import runpy
import select
import signal
import socket
import struct
import sys
import threading
import traceback

# What k25exp's jobs import, heaviest first: torch; MLflow's client and SQL store; the
# tokenizer classes (AutoTokenizer alone pulls in transformers' generation code and sklearn,
# ~4 s of a macro job); pyplot with the Agg backend k25exp picks itself (k25exp/plots.py).
PRELOAD = ("torch", "torch.distributed", "mlflow", "mlflow.tracking",
           "mlflow.store.tracking.sqlalchemy_store", "hydra", "omegaconf", "numpy", "httpx",
           "transformers", "transformers.models.auto.tokenization_auto", "matplotlib")


def _send(conn: socket.socket, text: str) -> None:
    conn.sendall(text.encode() + b"\n")


def _job(req: dict, fds: list[int]) -> None:
    """In the forked job process: become the job, run it, end as the interpreter would."""
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.sched_setaffinity(0, req["cpus"])  # as `taskset … python` would have pinned it
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    sys.path[0] = req["cwd"]  # `python -m` puts the working directory first
    argv = req["argv"]
    code, interrupted = 1, False
    try:
        if argv[:1] != ["-m"] or len(argv) < 2:
            raise SystemExit(f"warm_python: only `-m MODULE ARGS` is supported, not {argv}")
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as e:  # as the interpreter reads it
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:
            print(e.code, file=sys.stderr)
    except KeyboardInterrupt:
        traceback.print_exc()
        interrupted = True
    except BaseException:
        traceback.print_exc()
    # The interpreter's own ending, less its teardown of the preloaded modules (1.4 s of the
    # server's 3,300 modules, which a cold job never imports): non-daemon threads joined,
    # atexit handlers (logging, MLflow), streams flushed. A file left unclosed loses its
    # buffer here, where a cold interpreter would flush it: stricter, not looser.
    threading._shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    if interrupted:  # as Python ends on Ctrl-C: killed by SIGINT
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code & 0xFF if code >= 0 else 1)


def _waiter(conn: socket.socket, req: dict, fds: list[int]) -> None:
    """In a fork of the server: forks the job, reports its pid and exit code to the client,
    kills it if the client goes away."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the server ignores it; jobs wait on children
    pid = os.fork()
    if pid == 0:
        conn.close()
        _job(req, fds)  # never returns
    for fd in fds:
        os.close(fd)
    _send(conn, f"pid {pid}")
    job = os.pidfd_open(pid)  # readable once the job has ended: no polling, no delay
    while True:
        ready, _, _ = select.select([conn, job], [], [])
        if job in ready:
            break
        if not conn.recv(64):  # the client is gone: so is its job
            os.kill(pid, signal.SIGKILL)
            break
    _, status = os.waitpid(pid, 0)
    try:
        _send(conn, f"exit {os.waitstatus_to_exitcode(status)}")
    finally:
        os._exit(0)


def _recv_request(conn: socket.socket) -> tuple[dict, list[int]]:
    head, fds, _, _ = socket.recv_fds(conn, 4, 3)
    try:
        if len(head) != 4:
            raise ConnectionError("client closed before its request")
        (size,) = struct.unpack("!I", head)
        body = b""
        while len(body) < size:
            chunk = conn.recv(size - len(body))
            if not chunk:
                raise ConnectionError("client closed mid-request")
            body += chunk
        return json.loads(body), list(fds)
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise


def serve(path: str) -> None:
    import importlib

    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:  # a GPU node without MLflow, say: its jobs import what they need
            pass
    if "matplotlib" in sys.modules:
        sys.modules["matplotlib"].use("Agg")
        importlib.import_module("matplotlib.pyplot")
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(path + ".tmp")
    srv.listen(16)
    os.rename(path + ".tmp", path)  # clients see the socket only once it listens
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # waiters are reaped by the kernel
    sys.stdout.flush()
    sys.stderr.flush()
    while True:
        conn, _ = srv.accept()
        try:
            req, fds = _recv_request(conn)
        except (OSError, ValueError):  # a client killed mid-request (a wall-clock kill, say)
            conn.close()
            continue
        if os.fork() == 0:
            srv.close()
            _waiter(conn, req, fds)
        conn.close()
        for fd in fds:
            os.close(fd)


def run(path: str, argv: list[str]) -> int:
    conn = socket.socket(socket.AF_UNIX)
    conn.connect(path)
    body = json.dumps({"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ),
                       "cpus": sorted(os.sched_getaffinity(0))}).encode()
    socket.send_fds(conn, [struct.pack("!I", len(body))], [0, 1, 2])
    conn.sendall(body)
    reader = conn.makefile("r")
    pid = int(reader.readline().split()[1])
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda s, _f: os.kill(pid, s))
    line = reader.readline()
    code = int(line.split()[1]) if line.startswith("exit ") else 1
    if code < 0:  # killed by a signal: so is this process, as subprocess reports it
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        serve(sys.argv[2])
    else:
        sys.exit(run(sys.argv[1], sys.argv[2:]))
