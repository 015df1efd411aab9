"""What the serving runners (macro, profile, spec_decode) share about their server: the
facts logged with the run, and this job's part of the server log kept as an artifact."""

from __future__ import annotations

import logging
from pathlib import Path

from k25exp import vllm_kernels
from k25exp.config.schema import K25Config
from k25exp.redact import scrub
from k25exp.serving.endpoint import Connection, connect
from k25exp.serving.log_facts import log_facts
from k25exp.serving.process import ManagedServer
from k25exp.tracking.recorder import Recorder

log = logging.getLogger(__name__)


def connect_server(cfg: K25Config, **kw) -> Connection:
    """The server the config describes (launched, reused or attached), as connect() makes it."""
    return connect(cfg.server, cfg.model, cfg.seed, cfg.hardware.device,
                   redact=cfg.tracking.redact, cpu_isa=cfg.hardware.vllm_cpu_isa, **kw)


def server_cpu_isa(server: ManagedServer) -> str:
    """The kernel build(s) the server's processes mapped (its workers load them; the API
    server may not), read from /proc: what ran, whatever chose it."""
    pids = server.pids()
    if not pids:
        return "unknown (server process gone)"
    found = sorted({b for pid in pids for b in vllm_kernels.builds(pid)},
                   key=vllm_kernels.BUILDS.index)
    return vllm_kernels.describe(found)


def record_server(cfg: K25Config, conn: Connection, rec: Recorder) -> None:
    m = {"server_starts": 1.0 if conn.started else 0.0}
    if conn.started:
        m["server_start_s"] = conn.start_s
    rec.log_metrics(m)
    tags = {"server.kind": cfg.server.kind, "server.base_url": conn.base_url,
            "server.model": conn.model}
    if conn.managed:
        tags.update({"server.reused": str(not conn.started).lower(),
                     "server.pid": str(conn.managed.pid), "server.launch_key": conn.managed.key,
                     "server.model_path": conn.info.get("model_path", ""),
                     "server.log": str(conn.managed.log_path)})
        tags.update(log_facts(conn.managed.log_path))
        if cfg.hardware.device == "cpu":
            tags["vllm.cpu_isa"] = server_cpu_isa(conn.managed)
    else:  # an endpoint: its log is not ours to read
        tags["vllm.attention_backend"] = "unknown (server=endpoint: no server log here)"
    if conn.info.get("version"):
        tags["server.version"] = conn.info["version"]
    rec.set_tags(tags)
    log.info("server %s (%s)", conn.base_url,
             f"started in {conn.start_s:.1f} s" if conn.started else
             ("reused" if conn.managed else "endpoint"))


def copy_server_log(conn: Connection, out: Path) -> None:
    srv = conn.managed
    if srv is None or srv.log_path is None or not srv.log_path.exists():
        return
    with open(srv.log_path, "rb") as f:
        f.seek(conn.log_offset)
        text = f.read()
    # A secret the server printed itself (k25exp's own header has them masked already).
    secrets = {v for v in srv.spec.secret_env.values() if v}
    if secrets:
        text = scrub(text.decode(errors="replace"), secrets).encode()
    (out / "server.log").write_bytes(text)
