"""Starts the collective worker under torchrun, one process per rank, and waits for it.

The Hydra process never joins a process group: it writes a spec, runs torchrun as a child
process group (an argument list, never a shell string) and reads what the ranks wrote.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Optional
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from k25exp.collectives.spec import CollectiveSpec

log = logging.getLogger(__name__)


@dataclass
class Topology:
    """The part of the hardware config torchrun needs."""

    nproc_per_node: int
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None  # host:port of node 0 (static rendezvous)
    env: dict | None = None


@dataclass
class LaunchOutcome:
    returncode: int
    seconds: float
    log_tail: list[str]
    timed_out: bool = False
    wall_limit_s: Optional[float] = None

    @property
    def ok(self) -> bool:
        return self.returncode == 0


def rank_python() -> str:
    """The Python torchrun and its ranks run with: $K25EXP_PYTHON (an interpreter or a
    wrapper script taking Python's arguments, such as the tests' warm interpreter), else this
    one."""
    return os.environ.get("K25EXP_PYTHON") or sys.executable


def torchrun_argv(topo: Topology, spec_path: Path, out_dir: Path) -> list[str]:
    python = rank_python()
    argv = [python, "-m", "torch.distributed.run",
            f"--nproc-per-node={topo.nproc_per_node}", "--max-restarts=0"]
    if topo.nnodes == 1 and not topo.rdzv_endpoint:
        argv.append("--standalone")  # picks a free port itself: parallel jobs don't clash
    else:
        host, _, port = (topo.rdzv_endpoint or "").rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"hardware.rdzv_endpoint={topo.rdzv_endpoint!r}: expected host:port "
                             "of node 0 when hardware.nnodes > 1")
        # Static rendezvous: node_rank fixes which ranks live here, so node 0 is known to hold
        # rank 0 before anything starts (an elastic c10d rendezvous assigns them by arrival).
        argv += [f"--nnodes={topo.nnodes}", f"--node-rank={topo.node_rank}",
                 f"--master-addr={host}", f"--master-port={port}"]
    # --no-python: each rank is exactly this command (torchrun would run its own interpreter)
    argv += ["--no-python", python, "-m", "k25exp.collectives.worker", str(spec_path), str(out_dir)]
    return argv


def launch(spec: CollectiveSpec, topo: Topology, out_dir: Path,
           wall_limit_s: Optional[float] = None) -> LaunchOutcome:
    """Run the spec under torchrun; stream its output to the log and to out_dir/torchrun.log.

    wall_limit_s bounds the whole run (None: no bound); a hung collective is caught by the
    process group's own timeout (spec.pg_timeout_s) instead."""
    out_dir.mkdir(parents=True, exist_ok=True)
    spec_path = out_dir / "spec.json"
    spec.dump(spec_path)
    argv = torchrun_argv(topo, spec_path, out_dir)
    env = {**os.environ, **(topo.env or {}), "PYTHONUNBUFFERED": "1"}
    log.info("launching: %s", " ".join(argv))
    tail: deque[str] = deque(maxlen=40)
    t0 = time.perf_counter()
    timed_out = False
    with open(out_dir / "torchrun.log", "w") as logf:
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True)
        # A thread drains the pipe so the wait below can time out on a silent hang.
        reader = threading.Thread(target=_pump, args=(proc, logf, tail), daemon=True)
        reader.start()
        try:
            proc.wait(timeout=wall_limit_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            log.error("torchrun exceeded %.0f s; killing its process group", wall_limit_s)
            _kill_group(proc)
        except BaseException:  # Ctrl-C or an error here: never leave ranks behind
            _kill_group(proc)
            raise
        finally:
            reader.join(timeout=10)
    rc = proc.returncode if proc.returncode is not None else -9
    return LaunchOutcome(returncode=rc, seconds=time.perf_counter() - t0,
                         log_tail=list(tail), timed_out=timed_out, wall_limit_s=wall_limit_s)


def _pump(proc: subprocess.Popen, logf, tail: deque) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        logf.write(line)
        logf.flush()
        tail.append(line.rstrip())
        if line.startswith("[k25exp]"):
            log.info(line.strip()[9:])


def _kill_group(proc: subprocess.Popen) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=10)
            return
        except subprocess.TimeoutExpired:
            continue
