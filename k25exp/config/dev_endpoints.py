"""When vLLM's dev endpoints may be on (VLLM_SERVER_DEV_MODE=1).

They (/reset_prefix_cache, /start_profile, /stop_profile, /sleep, ...) answer without the API
key, so a launched server gets them only when it listens on a loopback address, or when the
config opts in with server.allow_dev_endpoints_on_network=true AND sets server.api_key_env.
An experiment that needs them on a server that may not have them is refused at config time,
before anything starts.
"""

from __future__ import annotations

import ipaddress
from typing import Optional

from k25exp.config.schema import ServerConfig


def is_loopback(host: str) -> bool:
    if host.strip("[]").lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


def dev_mode_allowed(server: ServerConfig) -> bool:
    return is_loopback(server.host) or (server.allow_dev_endpoints_on_network
                                        and bool(server.api_key_env))


def dev_endpoint_problems(server: ServerConfig, why: Optional[str], remedy: str = "") -> list[str]:
    """Config problems (an experiment's check lists them): dev endpoints needed (`why`, as the
    experiment says; None: not needed) on a server that would expose them to the network
    unprotected; `remedy`, the experiment's own way out, ends the message."""
    if server.kind != "vllm" or why is None or dev_mode_allowed(server):
        return []
    return [f"{why}, vLLM's dev endpoints, which answer without the API key; server.host="
            f"{server.host} is not a loopback address, so they stay off. Bind to 127.0.0.1, "
            "or set server.allow_dev_endpoints_on_network=true and server.api_key_env=<variable "
            "holding the key>" + remedy]
