"""The server manager's process lifecycle, against the fake vLLM server (tests/serving/
fake_vllm_server.py) launched through the real launch code: reuse, ports, early exits, secrets,
dev endpoints, answers that are not what was asked for. What the real vLLM does is checked in
test_macro_runner.py (its package-scoped server)."""

from __future__ import annotations

import asyncio
import http.server
import os
import re
import signal
import socket
import subprocess
import threading
import time
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

from k25exp.config.validate import ConfigError, to_typed
from k25exp.serving import server
from k25exp.load.client import CompletionClient
from tests.conftest import compose_cfg
from tests.serving.helpers import fake_marks, fake_model, fake_overrides, orphans, vllm_processes

pytestmark = pytest.mark.fake_server  # one xdist worker runs every server test, in order

HF_TOKEN = "hf_k25exp-fake-4b1d9e"


def typed(*overrides):
    return to_typed(compose_cfg(*overrides), gpu_count=lambda: 0)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return fake_model(tmp_path_factory.mktemp("fake_model"))


@pytest.fixture(scope="module")
def fake(model, tmp_path_factory):
    """One fake server through server.connect (the registry), with a secret in server.env and
    an extra name to redact from tracking.redact."""
    logs = tmp_path_factory.mktemp("fake_logs")
    overrides = fake_overrides(model, logs, f"HF_TOKEN={HF_TOKEN}", "HUB_AUTH=hub-pass-31",
                               "FAKE_VLLM_WORKERS=2")
    cfg = typed(*overrides, "tracking.redact=[HUB_AUTH]")
    conn = server.connect(cfg.server, cfg.model, cfg.seed, "cpu", redact=cfg.tracking.redact)
    yield {"cfg": cfg, "conn": conn, "logs": logs}
    server.stop_all()
    assert not orphans(marks=fake_marks(model)), "fake server processes left after stop_all"


def test_launched_server_is_its_own_process_group_and_stops_with_its_tree(fake):
    conn = fake["conn"]
    srv = conn.managed
    assert srv.alive() and conn.started and conn.start_s > 0
    # its own process group (stopped as a group), in our session: a session of its own is a
    # scheduling group of its own (autogroup), and its busy-polling workers starved the client
    assert os.getpgid(srv.pid) == srv.pid and os.getsid(srv.pid) == os.getsid(0)
    assert len(srv.pids()) == 3  # the server and its two workers
    assert srv.spec.env["VLLM_SERVER_DEV_MODE"] == "1"  # loopback: dev endpoints on


def test_same_server_config_reuses_the_running_server(fake):
    cfg = fake["cfg"]
    n = len(server.starts)
    again = server.connect(cfg.server, cfg.model, cfg.seed, "cpu", redact=cfg.tracking.redact)
    assert not again.started and again.managed is fake["conn"].managed
    assert len(server.starts) == n
    assert again.log_offset > 0  # a later job copies only its own part of the log


def test_secret_env_reaches_the_child_but_never_the_log(fake):
    srv = fake["conn"].managed
    text = srv.log_path.read_text()
    assert "HF_TOKEN is set" in text  # the child has it in its environment
    assert HF_TOKEN not in text and "hub-pass-31" not in text
    assert "HF_TOKEN=***redacted***" in text and "HUB_AUTH=***redacted***" in text
    assert HF_TOKEN not in repr(srv.spec) and HF_TOKEN not in str(srv.spec.env)
    assert HF_TOKEN not in srv.spec.describe() and HF_TOKEN not in " ".join(srv.spec.argv)
    assert srv.spec.secret_env["HF_TOKEN"] == HF_TOKEN


def test_split_cpus_gives_each_rank_its_block():
    assert server.split_cpus(2, [0, 1]) == "0|1"
    assert server.split_cpus(2, [0, 1, 2, 3, 4]) == "0,1|2,3"
    with pytest.raises(server.ServerError, match="needs at least 4 CPUs"):
        server.split_cpus(4, [0, 1])


def test_port_in_use_is_a_clear_error_naming_the_port(fake, tmp_path):
    mine = fake_marks(fake["cfg"].server.model_path)
    before = vllm_processes(marks=mine)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        spec = replace(fake["conn"].managed.spec, port=port, log_dir=tmp_path)
        srv = server.ManagedServer(spec)
        with pytest.raises(server.PortInUse,
                           match=rf"port {port} on 127.0.0.1 is already in use by pid {os.getpid()}"):
            srv.start()
    assert not srv.alive() and not srv.pids()
    assert vllm_processes(marks=mine) == before


def test_a_port_another_server_answers_on_is_in_use_not_ours(fake, tmp_path):
    """The port's owner answers /health and /v1/models as ours would: the start must not
    take it for its own server (no check-then-bind, but the listener's pid is checked)."""
    running = fake["conn"].managed
    spec = replace(running.spec, port=running.port, log_dir=tmp_path)
    srv = server.ManagedServer(spec)
    with pytest.raises(server.PortInUse, match=rf"port {running.port} on 127.0.0.1 is already in "
                       rf"use by pid {running.pid} \(.*fake_vllm_server"):
        srv.start()
    assert not srv.pids() and running.alive()


def test_missing_model_path_is_a_clear_error():
    cfg = typed("experiment=macro", "server.model_path=/nonexistent/ckpt")
    with pytest.raises(server.ServerStartError, match="server.model_path=/nonexistent/ckpt does not exist"):
        server.connect(cfg.server, cfg.model, cfg.seed, "cpu")


def test_server_that_exits_early_fails_with_its_log_tail(model, tmp_path):
    cfg = typed(*fake_overrides(model, tmp_path, "FAKE_VLLM_EXIT_EARLY=3", "FAKE_VLLM_WORKERS=0"))
    spec = server.launch_spec(cfg.server, model)
    srv = server.ManagedServer(spec)
    with pytest.raises(server.ServerStartError, match=r"(?s)exited with code 3 before it was "
                       r"ready.*last lines:.*exiting early as asked"):
        srv.start()
    assert not srv.alive() and not srv.pids()


def test_server_that_hangs_at_start_times_out_and_is_stopped(model, tmp_path):
    """A server that never answers is stopped at server.ready_timeout_s, its whole tree with
    it: the worker it had started by then (the fake names its pid; on a loaded machine it may
    not have got that far in 2 s, and then there is no worker to stop)."""
    cfg = typed(*fake_overrides(model, tmp_path, "FAKE_VLLM_HANG_AT_START=1",
                                "FAKE_VLLM_WORKERS=1"), "server.ready_timeout_s=2")
    srv = server.ManagedServer(server.launch_spec(cfg.server, model))
    with pytest.raises(server.ServerStartError, match=r"not ready after 2 s \(server.ready_"
                       r"timeout_s\)"):
        srv.start()
    assert not srv.pids()
    started = re.findall(r"workers started: pids (\d+)", srv.log_path.read_text())
    for pid in map(int, started):  # stopped with the tree (gone, or a zombie not yet reaped)
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_dev_endpoints_are_refused_on_a_network_bind_before_anything_starts(monkeypatch):
    n = len(server.starts)
    for exp in ("experiment=macro", "experiment=profile"):
        with pytest.raises(ConfigError, match=r"server.host=0.0.0.0 is not a loopback address.*"
                           r"server.allow_dev_endpoints_on_network=true and server.api_key_env"):
            typed(exp, "server.host=0.0.0.0")
    assert len(server.starts) == n  # refused at config time: nothing was launched
    # the opt-in with a key, or a macro run that doesn't reset the cache, is accepted
    monkeypatch.setenv("K25EXP_TEST_DEV_KEY", "k")
    opted = typed("experiment=macro", "server.host=0.0.0.0", "server.api_key_env=K25EXP_TEST_DEV_KEY",
                  "server.allow_dev_endpoints_on_network=true")
    assert server.launch_spec(opted.server, Path("/m")).env["VLLM_SERVER_DEV_MODE"] == "1"
    plain = typed("experiment=macro", "server.host=0.0.0.0", "experiment.reset_prefix_cache=false")
    assert "VLLM_SERVER_DEV_MODE" not in server.launch_spec(plain.server, Path("/m")).env
    for host in ("127.0.0.1", "127.3.0.1", "::1", "localhost"):
        spec = server.launch_spec(replace(plain.server, host=host), Path("/m"))
        assert spec.env["VLLM_SERVER_DEV_MODE"] == "1", host


class _ProxyPage(http.server.BaseHTTPRequestHandler):
    """Answers everything with 200 and an HTML page, as a login proxy in front of a server."""

    def _page(self):
        body = b"<!DOCTYPE html><html><body><h1>Please sign in</h1></body></html>"
        self.send_response(200)
        self.send_header("content-type", "text/html; charset=utf-8")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _page

    def log_message(self, *args):
        pass


@pytest.fixture
def proxy_page():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _ProxyPage)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_a_200_html_answer_is_a_clear_error_naming_the_url(proxy_page):
    with pytest.raises(server.BadAnswer, match=rf"GET {proxy_page}/v1/models: expected JSON .*got "
                       r"HTTP 200, content-type text/html; charset=utf-8: '<!DOCTYPE html>.*sign in"):
        server.wait_endpoint(proxy_page, "tiny_kimi", None, 5)

    async def complete():
        async with CompletionClient(proxy_page, "tiny_kimi", timeout_s=5) as c:
            return await c.complete("hello", 4, {}, time.perf_counter())

    rec = asyncio.run(complete())
    assert not rec["ok"]
    assert rec["error"].startswith(f"not an event stream: POST {proxy_page}/v1/completions "
                                   "answered HTTP 200, content-type text/html")
    assert "Please sign in" in rec["error"]


def test_kv_cache_size_in_gib_goes_to_vllm_in_bytes():
    cfg = typed("experiment=macro", "server.kv_cache_memory_gib=1.5")
    argv = server.launch_spec(cfg.server, Path("/m")).argv
    assert argv[argv.index("--kv-cache-memory-bytes") + 1] == str(3 * 2**29)  # 1.5 × 2^30
    assert "--kv-cache-memory-bytes" not in server.launch_spec(typed("experiment=macro").server, Path("/m")).argv


def test_the_worker_extension_is_loaded_only_where_the_workers_can_import_it():
    probe = ["--worker-extension-cls", "k25exp.serving.worker_extension.K25Worker"]

    def has_probe(*overrides):
        argv = server.launch_spec(typed("experiment=macro", *overrides).server, Path("/m")).argv
        i = argv.index("--worker-extension-cls") if "--worker-extension-cls" in argv else None
        return i is not None and argv[i:i + 2] == probe

    assert has_probe("server.tp=2")
    # the workers import it from the k25exp this process runs, wherever they start
    spec = server.launch_spec(typed("experiment=macro", "server.tp=2").server, Path("/m"))
    assert str(Path(__file__).parents[2]) in spec.env["PYTHONPATH"].split(os.pathsep)
    assert has_probe("server.tp=1")  # no TP group to time, but acceptance to set
    assert not has_probe("server.tp=2", "server.collective_probe=false")
    assert not has_probe("server.tp=2", "server.python=/opt/other-venv/bin/python")  # may lack k25exp
    # a user's own extension class wins: vLLM takes one
    argv = server.launch_spec(typed("experiment=macro", "server.tp=2",
                                    "server.extra_args=[--worker-extension-cls,my.Ext]").server,
                              Path("/m")).argv
    assert argv.count("--worker-extension-cls") == 1 and argv[-1] == "my.Ext"


def test_a_restart_names_the_settings_that_changed():
    """The line a multirun logs when a job's server differs from the running one: the flags
    and environment that changed; a changed --max-model-len (a context sweep's usual cause)
    also says how to keep one start."""
    from k25exp.serving.registry import restart_line

    def spec(*overrides):
        return server.launch_spec(typed("experiment=macro", *overrides).server, Path("/m"))

    short, long = spec("server.max_model_len=2048"), spec("server.max_model_len=4096")
    assert long.changes_from(short) == ["--max-model-len 2048 → 4096"]
    line = restart_line(short, long)
    assert "(--max-model-len 2048 → 4096)" in line
    assert "server.max_model_len is set once, to the longest prompt + output" in line
    # a flag that appears, a boolean flag gone, an environment value: each named
    other = spec("server.max_num_seqs=8", "server.enforce_eager=false", "server.cpu_kvcache_space_gib=2")
    assert other.changes_from(short) == ["--enforce-eager on → (unset)", "--max-num-seqs (unset) → 8",
                                         "env VLLM_CPU_KVCACHE_SPACE 1 → 2"]
    assert "max_model_len" not in restart_line(short, other)
    assert spec("server.max_model_len=2048").changes_from(short) == []


class Stop(BaseException):
    """What the test's SIGTERM handler raises (a KeyboardInterrupt would end pytest itself)."""


def test_a_stop_signal_inside_popen_stops_the_server_it_had_started(tmp_path, monkeypatch):
    """The fault injected: SIGTERM the moment Popen has started the server, before its result
    is ours (the window a Ctrl-C or a GPU stage's time limit can hit). Held until the process
    is known, it stops the server like any stop during its start; before, the handler's
    exception left Popen and the server (and the worker it starts) ran on, stopped by nobody."""
    model = fake_model(tmp_path / "model")  # its own marks: the module's fake server is not it
    cfg = typed(*fake_overrides(model, tmp_path / "logs", "FAKE_VLLM_WORKERS=1",
                                "FAKE_VLLM_START_DELAY_S=60"))
    srv = server.ManagedServer(server.launch_spec(cfg.server, model))
    real_popen = subprocess.Popen

    def popen(*args, **kw):
        child = real_popen(*args, **kw)
        os.kill(os.getpid(), signal.SIGTERM)  # handled at the next bytecode: still inside Popen
        return child

    def stop(signum, frame):
        raise Stop(signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        monkeypatch.setattr(subprocess, "Popen", popen)
        with pytest.raises(Stop):
            srv.start()
        monkeypatch.undo()
        assert signal.getsignal(signal.SIGTERM) is stop  # the handler it held is back
        assert srv.proc is not None and not srv.pids()
        assert not orphans(marks=fake_marks(model)), "the server outlived the stop"
    finally:
        signal.signal(signal.SIGTERM, previous)
        for p in vllm_processes(marks=fake_marks(model)):  # on failure: nothing left running
            psutil.Process(p[0]).kill()
