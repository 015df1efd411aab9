"""Endpoint mode: attach to a server someone else runs (nothing started or stopped), and what
every runner holds of its server, launched or attached: the Connection."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Optional

import httpx

from k25exp.config.schema import ModelConfig, ServerConfig
from k25exp.model import routing
from k25exp.poll import PollTimeout, wait_until
from k25exp.serving.answers import json_body, model_ids
from k25exp.serving.errors import BadAnswer, ServerError
from k25exp.serving.launch import api_key, auth_headers, launch_spec, resolve_model_path
from k25exp.serving.process import LOG_TAIL_LINES, ManagedServer
from k25exp.serving.registry import acquire


class _NotUp(Exception):
    """An answer that means 'not serving yet' (HTTP 502/503 from a proxy, 404 ...): try again."""


def wait_endpoint(base_url: str, served_model_name: str, key: Optional[str],
                  timeout_s: float) -> dict:
    """Checks an endpoint answers /v1/models and serves the model. Returns info."""
    with httpx.Client(base_url=base_url, timeout=5.0, headers=auth_headers(key)) as c:
        def served() -> Optional[list[str]]:
            r = c.get("/v1/models")
            if r.status_code in (401, 403):
                raise ServerError(f"endpoint {base_url} refused the API key (HTTP {r.status_code}); "
                                  "set server.api_key_env to the variable holding it")
            if r.status_code != 200:
                raise _NotUp(f"HTTP {r.status_code}")
            return model_ids(r)

        try:
            names = wait_until(served, timeout_s, 0.5, f"endpoint {base_url}",
                               retry_on=(httpx.TransportError, _NotUp))
        except PollTimeout as e:
            last = e.last if isinstance(e.last, _NotUp) else f"{type(e.last).__name__}: {e.last}"
            raise ServerError(f"endpoint {base_url} unreachable after {timeout_s:.0f} s "
                              f"(server.ready_timeout_s): {last}") from None
        if served_model_name not in names:
            raise ServerError(f"endpoint {base_url} serves {names}, not "
                              f"{served_model_name!r} (server.served_model_name)")
        return {"models": names, **server_version(c)}


def server_version(c: httpx.Client) -> dict:
    """{'version': '0.32.0'} from vLLM's GET /version; {} when the server has none."""
    try:
        v = c.get("/version")
        if v.status_code == 200:
            body = json_body(v)
            return {"version": str(body.get("version", ""))} if isinstance(body, dict) else {}
    except (httpx.HTTPError, BadAnswer):
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
            on_generate: Optional[Callable[[Path], None]] = None,
            redact: Iterable[str] = (), cpu_isa: Optional[str] = None) -> Connection:
    """Launches (or reuses) the configured server, or attaches to the endpoint. `redact`:
    extra env names to keep secret (tracking.redact); `cpu_isa`: hardware.vllm_cpu_isa."""
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
    spec = launch_spec(server, path, device, redact, cpu_isa,
                       routing.effective(model, server.load_format))
    srv, started = acquire(spec)
    with httpx.Client(base_url=srv.base_url, timeout=5.0) as c:
        version = server_version(c)
    return Connection(srv.base_url, server.served_model_name, key, managed=srv, started=started,
                      start_s=srv.start_s if started else None,
                      log_offset=0 if started else srv.log_size(),
                      info={"pid": srv.pid, "key": srv.key, "model_path": str(path), **version})
