"""Facts about where a job ran, logged as tags so a figure can be traced to its machine."""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import socket
import subprocess
from pathlib import Path

from k25exp import code_hash, vllm_kernels
from k25exp.serving import vllm_version

UNAVAILABLE = "unavailable"


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
        tags["git_diff_sha256"] = diff_hash(root)
    code = code_hash.working_tree_hash(root)
    if code:  # what can change a figure (k25exp.code_hash): the report's provenance reads it
        tags["code_sha256"] = code
        tags["code_sha256.scope"] = code_hash.DESCRIPTION
    tags.update(cpu_tags())
    tags.update(cuda_tags(torch))
    # vllm.version on every run ("not installed" where it is not), the source that release was
    # checked against and the path k25exp takes for it; "vllm" kept for runs read by name
    v = vllm_version.tags()
    tags.update(v)
    if v["vllm.version"] != vllm_version.NOT_INSTALLED:
        tags["vllm"] = v["vllm.version"]
    return tags


def diff_hash(root: Path) -> str:
    """sha256 of `git diff HEAD` (tracked files' uncommitted changes): two runs of one commit
    with different hashes ran different code; "clean" when there is no diff."""
    try:
        r = subprocess.run(["git", "-C", str(root), "diff", "HEAD"], capture_output=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return UNAVAILABLE
    if r.returncode != 0:
        return UNAVAILABLE
    return hashlib.sha256(r.stdout).hexdigest() if r.stdout else "clean"


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def cpu_tags() -> dict[str, str]:
    """CPU model, its ISA flags, cores, the cores this process may run on, and the frequency
    governor (a `powersave` box times slower than a `performance` one of the same model)."""
    names = local_device_names("cpu")
    try:
        affinity = str(len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        affinity = UNAVAILABLE
    flags = vllm_kernels.cpu_flags()
    return {"env.cpu_model": names[0] if names else UNAVAILABLE,
            # the ISA flags that decide vLLM's CPU kernel build (and AMX, which it uses)
            "env.cpu_isa_flags": " ".join(f for f, on in flags.items() if on) or "none of "
                                 + " ".join(flags),
            "env.cpu_cores": str(os.cpu_count() or UNAVAILABLE),
            "env.cpu_affinity": affinity,
            "env.cpu_governor": _read("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor")
            or "unavailable (no cpufreq in /sys)"}


def cuda_tags(torch) -> dict[str, str]:
    """On a CUDA box: CUDA and NCCL versions as torch was built with them, the driver, and per
    GPU its application clocks, power limit and ECC mode (NVML through nvidia-ml-py if importable, else
    nvidia-smi). Nothing off CUDA: a CPU run's tags stay about the CPU."""
    try:
        if not torch.cuda.is_available():
            return {}
    except Exception:
        return {}
    tags = {"env.cuda": str(torch.version.cuda)}
    try:
        v = torch.cuda.nccl.version()  # a tuple in recent torch, an int (2.21.5 → 22105) before
        tags["env.nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    except Exception as e:
        tags["env.nccl"] = f"{UNAVAILABLE} ({type(e).__name__})"
    tags.update(_nvml() or _nvidia_smi() or {"env.gpu_clocks": UNAVAILABLE + " (no NVML, no nvidia-smi)"})
    return tags


def _nvml() -> dict[str, str] | None:
    try:
        import pynvml  # nvidia-ml-py
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:
        return None
    try:
        out = {"env.driver": _s(pynvml.nvmlSystemGetDriverVersion())}
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)

            def q(fn, *a):
                try:
                    return fn(h, *a)
                except Exception:
                    return None
            # application clocks (the clocks work runs at, a setting), not the current clock,
            # which is a moment's reading and would make every two runs differ
            sm = q(pynvml.nvmlDeviceGetApplicationsClock, pynvml.NVML_CLOCK_SM)
            mem = q(pynvml.nvmlDeviceGetApplicationsClock, pynvml.NVML_CLOCK_MEM)
            sm_max = q(pynvml.nvmlDeviceGetMaxClockInfo, pynvml.NVML_CLOCK_SM)
            power = q(pynvml.nvmlDeviceGetPowerManagementLimit)
            ecc = q(pynvml.nvmlDeviceGetEccMode)
            gpus.append((f"sm {sm} MHz (max {sm_max}), mem {mem} MHz",
                         f"{power / 1000:g} W" if power else UNAVAILABLE,
                         ("on" if ecc[0] else "off") if ecc else UNAVAILABLE))
        return {**out, **_per_gpu(gpus), "env.gpu_info_source": "nvml"}
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def _s(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _nvidia_smi() -> dict[str, str] | None:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    fields = ("driver_version,clocks.applications.graphics,clocks.max.sm,clocks.applications.memory,"
              "power.limit,ecc.mode.current")
    try:
        r = subprocess.run([exe, f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
                           capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    rows = [[x.strip() for x in line.split(",")] for line in r.stdout.splitlines() if line.strip()]
    if r.returncode != 0 or not rows or any(len(x) != 6 for x in rows):
        return None
    # written as the NVML path writes them, so the source alone never makes two runs differ
    gpus = [(f"sm {x[1]} MHz (max {x[2]}), mem {x[3]} MHz", _watts(x[4]),
             {"enabled": "on", "disabled": "off"}.get(x[5].lower(), x[5].lower())) for x in rows]
    return {"env.driver": rows[0][0], **_per_gpu(gpus), "env.gpu_info_source": "nvidia-smi"}


def _watts(v: str) -> str:
    try:
        return f"{float(v):g} W"
    except ValueError:  # "[N/A]"
        return UNAVAILABLE


def _per_gpu(gpus: list[tuple[str, str, str]]) -> dict[str, str]:
    """One tag per quantity: the value when all GPUs agree, else each GPU's, by index."""
    from k25exp.telemetry.summary import one_per_gpu as one

    return {"env.gpu_clocks": one([g[0] for g in gpus]), "env.gpu_power_limit": one([g[1] for g in gpus]),
            "env.gpu_ecc": one([g[2] for g in gpus])}


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
