"""The vLLM server manager, one import away: launch from config (launch), one process and its
tree (process, ports), the servers of this process by launch key (registry), someone else's server
and the Connection a runner holds (endpoint). The modules hold the code; this re-exports it."""

from k25exp.serving.endpoint import Connection, connect, server_version, wait_endpoint
from k25exp.serving.errors import (BadAnswer, PortInUse, ServerDied, ServerError,
                                   ServerStartError)
from k25exp.serving.launch import (LaunchSpec, api_key, auth_headers, launch_spec,
                                   resolve_model_path, split_cpus)
from k25exp.serving.ports import free_port, port_owner
from k25exp.serving.process import LOG_TAIL_LINES, ManagedServer, process_tree
from k25exp.serving.registry import acquire, release, running, starts, stop_all

__all__ = ["BadAnswer", "Connection", "LOG_TAIL_LINES", "LaunchSpec", "ManagedServer",
           "PortInUse", "ServerDied", "ServerError", "ServerStartError", "acquire", "api_key",
           "auth_headers", "connect", "free_port", "launch_spec", "port_owner", "process_tree",
           "release", "resolve_model_path", "running", "server_version", "split_cpus", "starts",
           "stop_all", "wait_endpoint"]
