"""This job's processes (itself, its torchrun ranks, its vLLM server tree), from /proc.

A GPU process that is not one of them shares the GPU with the run. Read straight from
/proc so the sampler needs nothing but the standard library.
"""

from __future__ import annotations

from pathlib import Path


def _ppid(stat: str) -> int:
    # /proc/<pid>/stat: "pid (comm) state ppid ..."; comm may hold spaces and parentheses
    return int(stat[stat.rindex(")") + 2:].split()[1])


def parents(proc: Path = Path("/proc")) -> dict[int, int]:
    """pid → parent pid of every process visible here (ones that exit mid-scan are skipped)."""
    out: dict[int, int] = {}
    for d in proc.iterdir():
        if not d.name.isdigit():
            continue
        try:
            out[int(d.name)] = _ppid((d / "stat").read_text())
        except (OSError, ValueError, IndexError):
            continue
    return out


def tree(root: int, proc: Path = Path("/proc")) -> set[int]:
    """``root`` and every process descending from it."""
    children: dict[int, list[int]] = {}
    for pid, ppid in parents(proc).items():
        children.setdefault(ppid, []).append(pid)
    seen, todo = {root}, [root]
    while todo:
        for c in children.get(todo.pop(), ()):
            if c not in seen:
                seen.add(c)
                todo.append(c)
    return seen


def describe(pid: int, proc: Path = Path("/proc")) -> str | None:
    """The process's command line (first 120 characters), its name if that is unreadable,
    None when no such pid is visible here (it exited, or lives in another pid namespace)."""
    d = proc / str(pid)
    try:
        cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        return (cmd or (d / "comm").read_text().strip())[:120]
    except OSError:
        return None
