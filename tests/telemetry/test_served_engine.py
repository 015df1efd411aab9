"""With server=endpoint on the same host, the server the job measures is not another tenant:
the processes listening on the endpoint's port, and their children (vLLM's API server and its
VLLM::EngineCore, which holds the GPU), are the served engine. Checked on a real process tree
on loopback (a listening parent and its child, re-parented away from this test as a server
someone else started is), with the GPU side on FakeNvml (no GPU here)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from k25exp.config.validate import to_typed
from k25exp.telemetry import procs
from k25exp.telemetry.summary import summarize
from k25exp.tracking import telemetry
from tests.conftest import compose_cfg
from tests.telemetry.fake_nvml import FakeGpu, FakeNvml
from tests.telemetry.test_summary import stranger  # noqa: F401 (a fixture)

GIB = 2**30

# A stand-in for `vllm serve`: listens on a loopback port, starts its "engine core" child,
# writes "<port> <child pid>" to the file named in argv[1], then waits.
SERVER = """
import socket, subprocess, sys, time
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen()
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
open(sys.argv[1] + ".tmp", "w").write(f"{s.getsockname()[1]} {child.pid}")
__import__("os").rename(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(120)
"""


@pytest.fixture
def served(tmp_path):
    """(port, server pid, engine pid) of a server tree that is not this test's descendant:
    started by a shell that exits. Both ended by their pids afterwards."""
    info = tmp_path / "server.txt"
    out = subprocess.run(["sh", "-c", f'"{sys.executable}" -c \'{SERVER}\' {info} >/dev/null 2>&1 & echo $!'],
                         capture_output=True, text=True, check=True)
    server = int(out.stdout)
    deadline = time.monotonic() + 30
    while not info.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    port, engine = map(int, info.read_text().split())
    yield port, server, engine
    for pid in (engine, server):
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass


def endpoint_cfg(base_url: str, *extra: str):
    return to_typed(compose_cfg("experiment=macro", "hardware=h200_x1", "server=endpoint",
                                f"server.base_url={base_url}", "server.tokenizer=/nowhere", *extra),
                    gpu_count=lambda: 1)


def sample(cfg, gpu_procs):
    """The job hook's sampler (k25exp.tracking.telemetry.start) over one process check."""
    nvml = FakeNvml([FakeGpu(procs=gpu_procs)])
    sampler, why_not = telemetry.start(cfg, nvml)
    assert sampler is not None, why_not
    r = sampler.stop()
    if not r.processes:  # the thread had not reached its first process check yet
        sampler.check_processes(time.time())
        r = sampler.stop()
    return summarize(r)


def test_the_endpoints_engine_is_the_measured_engine(served, monkeypatch):
    port, server, engine = served
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert procs.descends_from(engine, os.getpid()) is False  # not the job's, as on the GPU box
    for url in (f"http://127.0.0.1:{port}", f"http://localhost:{port}/v1"):
        rep = sample(endpoint_cfg(url), [(engine, int(92.7 * GIB))])
        assert not rep.warnings
        assert rep.metrics["telemetry.gpu_shared"] == 0
        assert rep.metrics["telemetry.foreign_processes"] == 0
        assert rep.tags["telemetry.gpu_shared"] == (
            "no: only the served engine's processes on the GPU (the endpoint's server: pid "
            f"{server} listening on 127.0.0.1:{port}, and its children)")
        assert [row[2:] for row in rep.process_rows] == [[engine, f"{92.7 * 1024:g}", 1, "(the served engine)"]]
    pids, note = procs.served_engine(f"http://127.0.0.1:{port}")
    assert pids == {server}
    assert note == f"pid {server} listening on 127.0.0.1:{port}, and its children"


def test_another_process_beside_the_engine_still_shares_it(served, stranger, monkeypatch):  # noqa: F811
    port, server, engine = served
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    rep = sample(endpoint_cfg(f"http://127.0.0.1:{port}"), [(engine, 90 * GIB), (stranger, 3 * GIB)])
    assert rep.metrics["telemetry.gpu_shared"] == 1 and rep.metrics["telemetry.foreign_processes"] == 1
    assert rep.tags["telemetry.gpu_shared"] == f"yes: GPU 0: pid {stranger} (sleep 60) 3.0 GiB"
    assert any("shared" in w for w in rep.warnings)


def test_not_the_engine_when_it_is_not_the_endpoints(served, monkeypatch):
    port, server, engine = served
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    # another host (TEST-NET-1, RFC 5737), same port: whatever listens here is not its server
    rep = sample(endpoint_cfg(f"http://203.0.113.7:{port}"), [(engine, 90 * GIB)])
    assert rep.metrics["telemetry.gpu_shared"] == 1
    assert procs.served_engine(f"http://203.0.113.7:{port}") == (set(), "none: 203.0.113.7 is not this host")
    # a server this job launches (server=vllm) is in the job's own tree; one listening on the
    # port of a config that launches is someone else's
    launching = to_typed(compose_cfg("experiment=macro", "hardware=h200_x1", f"server.port={port}"),
                         gpu_count=lambda: 1)
    assert launching.server.kind == "vllm"
    rep = sample(launching, [(engine, 90 * GIB)])
    assert rep.metrics["telemetry.gpu_shared"] == 1
    # nothing listens on the port any more
    os.kill(server, 9)
    deadline = time.monotonic() + 10
    while procs.describe(server) is not None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert procs.served_engine(f"http://127.0.0.1:{port}") == (
        set(), f"none found: no process visible here listens on port {port}")


def test_a_gemm_job_beside_an_endpoint_shares_the_gpu(served, monkeypatch):
    # a GEMM job drives no server (no server group in its config): the engine beside it is
    # another tenant of the GPU
    port, server, engine = served
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    cfg = to_typed(compose_cfg("experiment=gemm", "hardware=h200_x1"), gpu_count=lambda: 1)
    assert cfg.server is None
    rep = sample(cfg, [(engine, 90 * GIB)])
    assert rep.metrics["telemetry.gpu_shared"] == 1


def test_the_real_ancestry_of_the_engine(served):
    port, server, engine = served
    assert procs.ancestry(engine)[:2] == [engine, server]
    assert procs.ancestry(server)[0] == server and os.getpid() not in procs.ancestry(server)
    assert procs.ancestry(os.getpid())[0] == os.getpid()
