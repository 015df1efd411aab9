"""One call of a k25exp worker-extension method on every worker of a server, through vLLM's
`/collective_rpc` dev endpoint (loopback servers only: k25exp.config.dev_endpoints). vLLM
passes only string arguments to a worker method, so the argument is one JSON string."""

from __future__ import annotations

import json
from typing import Any


def call(base_url: str, method: str, arg: Any, timeout_s: float) -> list:
    """Every worker's answer to `method(json.dumps(arg))`, as vLLM returns them."""
    import httpx

    body = {"method": method, "args": [json.dumps(arg)], "timeout": timeout_s}
    r = httpx.post(f"{base_url.rstrip('/')}/collective_rpc", json=body, timeout=timeout_s + 30)
    if r.status_code == 404:
        raise RuntimeError("POST /collective_rpc: 404: the server runs without "
                           "VLLM_SERVER_DEV_MODE=1 (a non-loopback bind)")
    r.raise_for_status()
    return r.json().get("results") or []
