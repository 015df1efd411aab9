"""Whose process is it: a GPU process is this job's when the job's process (the Hydra job,
parent of its torchrun ranks and of its vLLM server tree) is among its ancestors; it is the
served engine's when the job measures a server it attached to (server=endpoint) on this host
and a process listening on the endpoint's port is among its ancestors (vLLM's API server,
parent of VLLM::EngineCore, parent of the workers at TP > 1).

Read straight from /proc, walking up from the GPU's few processes rather than scanning every
process: a scan of /proc cost 6 ms with 185 processes on the H200 box, in the job's own
process (beside the macro client's event loop), where the walk costs ~0.1 ms per GPU process.
The endpoint's listeners are looked up once, before the job measures (psutil scans every
process's sockets).
"""

from __future__ import annotations

import ipaddress
import socket
from pathlib import Path
from typing import Optional
from urllib.parse import urlsplit

MAX_DEPTH = 128  # a walk longer than this is a loop in a torn read, not a process tree


def parent(pid: int, proc: Path = Path("/proc")) -> Optional[int]:
    """The parent pid, or None when no such pid is visible here."""
    try:
        stat = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses
    try:
        return int(stat[stat.rindex(")") + 2:].split()[1])
    except (ValueError, IndexError):
        return None


def ancestry(pid: int, proc: Path = Path("/proc")) -> Optional[list[int]]:
    """``pid`` and its ancestors, nearest first, as far up as they are visible; None when
    ``pid`` itself is not visible here (it exited, or lives in another pid namespace). An
    ancestor gone mid-walk ends the chain there."""
    chain, p = [pid], pid
    for _ in range(MAX_DEPTH):
        up = parent(p, proc)
        if up is None:
            return None if p == pid else chain
        if up == 0:  # past pid 1 (or a process of another session's init)
            return chain
        chain.append(up)
        p = up
    return chain


def descends_from(pid: int, root: int, proc: Path = Path("/proc")) -> Optional[bool]:
    """Whether ``pid`` is ``root`` or one of its descendants; None when ``pid`` is not visible
    here (it exited, or lives in another pid namespace)."""
    if pid == root:
        return True
    chain = ancestry(pid, proc)
    return None if chain is None else root in chain


WILDCARDS = {"0.0.0.0", "::"}


def served_engine(base_url: str) -> tuple[set[int], str]:
    """The processes serving ``base_url`` when its server runs on this host: each process
    listening on the URL's port at an address the URL reaches (vLLM's API server; with
    --api-server-count > 1 also the parent that holds the socket), whose descendants are the
    engine; and a note saying what was found, or why nothing."""
    import psutil  # a dependency of k25exp; imported here: the sampler alone does not need it

    u = urlsplit(base_url)
    host = u.hostname or ""
    port = u.port or (443 if u.scheme == "https" else 80)
    try:
        targets = {_ip(a[4][0]) for a in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)}
    except OSError as e:
        return set(), f"none: {host} does not resolve here ({e})"
    mine = {_ip(a.address) for nic in psutil.net_if_addrs().values() for a in nic
            if a.family in (socket.AF_INET, socket.AF_INET6)}
    here = {a for a in targets if ipaddress.ip_address(a).is_loopback or a in mine}
    if not here:
        return set(), f"none: {host} is not this host"
    try:
        conns = psutil.net_connections(kind="tcp")
    except psutil.Error as e:  # AccessDenied where the platform hides other processes' sockets
        return set(), f"none found: listening sockets unreadable here ({type(e).__name__})"
    found: dict[int, str] = {}
    hidden = 0
    for c in conns:
        if (c.status != psutil.CONN_LISTEN or not c.laddr or c.laddr.port != port
                or not (_ip(c.laddr.ip) in here or c.laddr.ip in WILDCARDS)):
            continue
        if c.pid:
            found.setdefault(c.pid, _join(c.laddr.ip, port))
        else:
            hidden += 1  # another user's process: its pid is not shown to us
    if not found:
        why = (f"{hidden} listening socket(s) on port {port} whose process is not visible here"
               if hidden else f"no process visible here listens on port {port}")
        return set(), f"none found: {why}"
    listed = ", ".join(f"pid {pid} listening on {addr}" for pid, addr in sorted(found.items()))
    return set(found), f"{listed}, and its children" if len(found) == 1 else f"{listed}, and their children"


def _ip(address: str) -> str:
    """An address as ipaddress writes it, without an IPv6 zone; an IPv4-mapped IPv6 address
    as its IPv4 address."""
    ip = ipaddress.ip_address(address.split("%")[0])
    mapped = getattr(ip, "ipv4_mapped", None)
    return str(mapped or ip)


def _join(ip: str, port: int) -> str:
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def describe(pid: int, proc: Path = Path("/proc")) -> Optional[str]:
    """The process's command line (first 120 characters), its name if that is unreadable,
    None when no such pid is visible here."""
    d = proc / str(pid)
    try:
        cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        return (cmd or (d / "comm").read_text().strip())[:120]
    except OSError:
        return None
