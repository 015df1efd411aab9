"""Ports: a free one for server.port=0, whether one can be bound (k25exp ui), and who listens
on one (to name it in errors, and to tell our server's answer from someone else's on the same
port)."""

from __future__ import annotations

import socket

import psutil


def _socket(host: str) -> socket.socket:
    return socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)


def free_port(host: str = "127.0.0.1") -> int:
    with _socket(host) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def taken(host: str, port: int) -> str:
    """'' if `host:port` can be bound the way a uvicorn server binds it (SO_REUSEADDR); else why
    not: whoever listens there ('pid N (cmdline)') where visible, else the OS's reason."""
    with _socket(host) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
            return ""
        except OSError as e:
            return port_owner(port) or e.strerror or str(e)


def listeners(port: int) -> set[int]:
    """Pids listening on TCP `port` that this user may see (empty when unknown)."""
    try:
        return {c.pid for c in psutil.net_connections(kind="tcp") if c.laddr and c.pid
                and c.laddr.port == port and c.status == psutil.CONN_LISTEN}
    except (psutil.Error, OSError):
        return set()


def port_owner(port: int) -> str:
    """'pid 123 (cmdline)' of whatever listens on `port`, best effort ('' if unknown)."""
    for pid in sorted(listeners(port)):
        try:
            return f"pid {pid} ({' '.join(psutil.Process(pid).cmdline())[:160]})"
        except psutil.Error:
            pass
    return ""
