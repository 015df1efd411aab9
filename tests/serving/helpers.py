"""Helpers shared by the tests that start real vLLM servers."""

from __future__ import annotations

import os
import time
from pathlib import Path

from k25exp.serving import server


def vllm_processes(exclude: set[int] = frozenset()) -> list[tuple[int, str]]:
    """Live processes that belong to a vLLM server (API server, engine core, TP workers)."""
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) in exclude or int(d) == os.getpid():
            continue
        try:
            stat = Path(f"/proc/{d}/stat").read_text()
            if stat[stat.rindex(")") + 2] == "Z":
                continue
            comm = Path(f"/proc/{d}/comm").read_text().strip()
            cmd = Path(f"/proc/{d}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError):
            continue
        if comm.startswith("VLLM") or "vllm.entrypoints" in cmd or "VLLM::" in cmd:
            found.append((int(d), f"{comm}: {cmd[:120]}"))
    return found


def orphans(grace_s: float = 3.0) -> list[tuple[int, str]]:
    """vLLM processes that no server of this (pytest) process owns, after a short grace."""
    deadline = time.monotonic() + grace_s
    while True:
        mine = {p for s in server.running() for p in s.pids()}
        left = vllm_processes(mine)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)
