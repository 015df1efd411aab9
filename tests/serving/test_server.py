"""The server manager against the real vLLM CPU build: launch, reuse, clear failures."""

from __future__ import annotations

import socket
from dataclasses import replace

import httpx
import pytest

from k25exp.config.validate import to_typed
from k25exp.serving import server
from tests.conftest import compose_cfg
from tests.serving.conftest import SECRET
from tests.serving.helpers import vllm_processes


def test_launched_server_is_its_own_session_with_split_cpus_and_a_key(vllm):
    conn = vllm["conn"]
    srv = conn.managed
    assert srv.alive() and conn.started and conn.start_s > 0
    assert server._stat(srv.pid)[1] == srv.pid  # session leader: stopped as a group
    assert len(srv.pids()) >= 4  # API server, engine core, one worker per TP rank
    spec = srv.spec
    assert spec.argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert spec.argv[spec.argv.index("--tensor-parallel-size") + 1] == "2"
    assert spec.env["VLLM_CPU_OMP_THREADS_BIND"] == server.split_cpus(2)
    assert spec.env["VLLM_CPU_KVCACHE_SPACE"] == "1" and spec.env["VLLM_SERVER_DEV_MODE"] == "1"
    assert SECRET not in " ".join(spec.argv) and SECRET not in str(spec.env)
    assert SECRET not in spec.key() and SECRET not in repr(spec)
    assert httpx.get(conn.base_url + "/v1/models").status_code == 401
    r = httpx.get(conn.base_url + "/v1/models", headers=server.auth_headers(SECRET))
    assert [m["id"] for m in r.json()["data"]] == ["tiny_kimi"]


def test_split_cpus_gives_each_rank_its_block():
    assert server.split_cpus(2, [0, 1]) == "0|1"
    assert server.split_cpus(2, [0, 1, 2, 3, 4]) == "0,1|2,3"
    with pytest.raises(server.ServerError, match="needs at least 4 CPUs"):
        server.split_cpus(4, [0, 1])


def test_same_server_config_reuses_the_running_server(vllm):
    cfg = vllm["cfg"]
    n = len(server.starts)
    again = server.connect(cfg.server, cfg.model, cfg.seed, "cpu")
    assert not again.started and again.managed is vllm["conn"].managed
    assert len(server.starts) == n
    assert again.log_offset > 0  # a later job copies only its own part of the log


def test_port_in_use_is_a_clear_error_before_anything_starts(vllm, tmp_path):
    before = vllm_processes()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        spec = replace(vllm["conn"].managed.spec, port=port, log_dir=tmp_path)
        with pytest.raises(server.ServerStartError,
                           match=rf"port {port} on 127.0.0.1 is already in use by pid \d+"):
            server.ManagedServer(spec).start()
    assert not list(tmp_path.iterdir())  # no log: nothing was launched
    assert vllm_processes() == before


def test_missing_model_path_is_a_clear_error():
    cfg = to_typed(compose_cfg("experiment=macro", "server.model_path=/nonexistent/ckpt"),
                   gpu_count=lambda: 0)
    with pytest.raises(server.ServerStartError, match="server.model_path=/nonexistent/ckpt does not exist"):
        server.connect(cfg.server, cfg.model, cfg.seed, "cpu")


def test_server_that_exits_early_fails_with_its_log_tail(vllm, tmp_path):
    spec = vllm["conn"].managed.spec
    bad = replace(spec, argv=spec.argv + ["--no-such-flag"], port=server.free_port(),
                  log_dir=tmp_path, ready_timeout_s=120)
    bad.argv[bad.argv.index("--port") + 1] = str(bad.port)
    srv = server.ManagedServer(bad)
    with pytest.raises(server.ServerStartError, match=r"(?s)exited with code \d+ before it was "
                       r"ready.*last lines:.*no-such-flag"):
        srv.start()
    assert not srv.alive() and not srv.pids()
