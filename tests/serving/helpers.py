"""Helpers shared by the tests that start servers, real vLLM or the fake one."""

from __future__ import annotations

import os
from pathlib import Path

import psutil

from k25exp.poll import wait_until
from k25exp.serving import server

VLLM_MARKS = ("vllm.entrypoints", "VLLM::")  # API server, engine core, TP workers
FAKE_ENTRYPOINT = "server.entrypoint=[-m,tests.serving.fake_vllm_server]"


def vllm_processes(exclude: set[int] = frozenset(), marks: tuple[str, ...] = VLLM_MARKS,
                   groups: set[int] | None = None) -> list[tuple[int, str]]:
    """Live processes that belong to a server (vLLM's by default; one fake server's with
    fake_marks), only those in the process groups `groups` when given."""
    found = []
    for p in psutil.process_iter(["name", "cmdline", "status"]):
        if p.pid in exclude or p.pid == os.getpid() or p.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        name, cmd = p.info["name"] or "", " ".join(p.info["cmdline"] or []) + " "
        if not ((marks == VLLM_MARKS and name.startswith("VLLM")) or any(m in cmd for m in marks)):
            continue
        try:
            if groups is not None and os.getpgid(p.pid) not in groups:
                continue
        except ProcessLookupError:
            continue
        found.append((p.pid, f"{name}: {cmd[:120]}"))
    return found


def started_here() -> set[int]:
    """The process groups of every server this process started: k25exp starts each in a
    group of its own whose id is the server's pid, and vLLM's engine and workers (whose
    titles and environment setproctitle overwrites) stay in it."""
    from k25exp.serving import registry

    return {pid for _, _, pid in registry.starts}


def fake_marks(model: Path) -> tuple[str, ...]:
    """Marks of the fake servers (and their workers) that serve `model` only: fake-server
    modules run beside each other, each with its own model folder."""
    return (f"--model {model} ",)


def orphans(grace_s: float = 3.0, marks: tuple[str, ...] = VLLM_MARKS,
            groups: set[int] | None = None) -> list[tuple[int, str]]:
    """Server processes a test started that no running server of this (pytest) process owns,
    after a short grace. Which a test started: the fake servers' marks name its own model
    folder; vLLM's are looked for in `groups` (default: the servers this process started),
    never among every vLLM process on the machine (another test process's, a developer's)."""
    if marks == VLLM_MARKS and groups is None:
        groups = started_here()

    def left() -> list[tuple[int, str]]:
        return vllm_processes({p for s in server.running() for p in s.pids()}, marks, groups)

    wait_until(lambda: not left(), grace_s, 0.2, "orphans gone", raise_timeout=False)
    return left()


def fake_model(folder: Path) -> Path:
    """A 'checkpoint' for the fake server: only the tiny model's tokenizer (prompts need it)."""
    from k25exp.serving.tiny_model import write_tokenizer

    if not (folder / "tokenizer.json").exists():
        folder.mkdir(parents=True, exist_ok=True)
        write_tokenizer(folder, 4096, seed=0)
    return folder


def fake_overrides(model: Path, log_dir: Path, *env: str) -> list[str]:
    """Config overrides that launch the fake server through k25exp's real launch code;
    `env`: 'NAME=value' for server.env (the fake's behaviour, FAKE_VLLM_*)."""
    return ["experiment=macro", FAKE_ENTRYPOINT, f"server.model_path={model}", "server.port=0",
            f"server.log_dir={log_dir}", "server.ready_timeout_s=30", "server.stop_timeout_s=5",
            *(f"+server.env.{e}" for e in env)]
