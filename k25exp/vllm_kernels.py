"""vLLM's compiled kernels: loaded the way vLLM loads them, and which build a process holds.

vLLM's CPU wheel ships one kernel library per x86 ISA, all registering `torch.ops._C`:

    _C.abi3.so         AVX-512 + AVX512-BF16 (AMX tiles used at run time where present)
    _C_AVX512.abi3.so  AVX-512 without BF16
    _C_AVX2.abi3.so    AVX2 (no shared-memory all-reduce, no weight_packed_linear)

`CpuPlatform.import_kernels()` picks one from torch's view of the CPU
(`torch.cpu._is_avx512_supported()`, `_is_avx512_bf16_supported()`); importing `vllm._C` by
hand loads the AVX-512 build whatever the CPU, which dies with SIGILL on an AVX2-only one.
So k25exp never imports a `_C` module itself: `load()` asks vLLM's platform.

AMX tiles pick no library of their own: the `_C` build uses them at run time where torch says
the CPU has them (`torch.cpu._is_amx_tile_supported()`), and vLLM picks its attention backend
by the same probe (an MLA model: AMX_MLA with tiles, else CPU_MLA). So the levels are the three
builds and `amx` above them; `build_of(level)` is the library a level loads.

`cap(isa)` makes torch (and so vLLM) report no more than `isa`, so an AVX-512 machine runs
the path an AVX2-only machine takes, and an AMX machine (`cap("avx512_bf16")`) the path of an
AVX-512 one without tiles. It must run before vLLM loads its kernels, in every
process that loads them: collective ranks and GEMM jobs call `cap_from_env()`; a vLLM server
(whose own processes k25exp does not run) gets `site_dir()` on PYTHONPATH, whose
sitecustomize does the same at interpreter start.

`builds(pid)` reads which library a process has mapped (/proc/PID/maps): ground truth,
whatever chose it. Imports torch alone.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

# The variable that carries the cap to child processes (ranks, server workers).
ENV = "K25EXP_VLLM_CPU_ISA"
# The kernel libraries, lowest to highest; each is the one vLLM loads when the CPU offers that much.
BUILDS = ("avx2", "avx512", "avx512_bf16")
LIBRARY = {"_C_AVX2": "avx2", "_C_AVX512": "avx512", "_C": "avx512_bf16"}
# What a CPU (or a cap) may offer, lowest to highest: the builds, then AMX tiles (used by the
# avx512_bf16 build's kernels and by vLLM's AMX_MLA attention backend).
LEVELS = BUILDS + ("amx",)
# The /proc/cpuinfo flags that decide it.
FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16")

# torch.cpu probes vLLM reads, and the level each needs (None: hidden under any cap; AMX-FP16
# is a later generation than any level here names).
_PROBES = {"_is_avx512_supported": "avx512", "_is_vnni_supported": "avx512",
           "_is_avx512_bf16_supported": "avx512_bf16", "_is_amx_tile_supported": "amx",
           "_is_amx_fp16_supported": None}


def cpu_flags(cpuinfo: str | None = None) -> dict[str, bool]:
    """The ISA flags of FLAGS this CPU has (Linux /proc/cpuinfo; all False elsewhere)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    return _parse(cpuinfo)


def _parse(cpuinfo: str) -> dict[str, bool]:
    have: set[str] = set()
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            have = set(line.split(":", 1)[1].split())
            break
    return {f: f in have for f in FLAGS}


def native_level(flags: dict[str, bool] | None = None) -> str | None:
    """The highest LEVEL this CPU supports (None: not even AVX2, or not x86)."""
    f = cpu_flags() if flags is None else flags
    if f.get("avx512f") and f.get("avx512_bf16"):
        return "amx" if f.get("amx_tile") and f.get("amx_bf16") else "avx512_bf16"
    if f.get("avx512f"):
        return "avx512"
    return "avx2" if f.get("avx2") else None


def check_level(isa: str, native: str | None) -> str | None:
    """Why `isa` cannot be forced on a CPU whose best level is `native` (None if it can)."""
    if isa not in LEVELS:
        return f"{isa!r} is not one of {', '.join(LEVELS)}"
    if native is None or LEVELS.index(isa) > LEVELS.index(native):
        return (f"{isa!r} is above what this CPU supports ({native or 'no AVX2'}): its kernels "
                "would die with SIGILL")
    return None


def build_of(level: str) -> str:
    """The kernel build (BUILDS) vLLM loads at `level`: AMX tiles run inside the avx512_bf16 one."""
    if level not in LEVELS:
        raise ValueError(f"{level!r} is not one of {', '.join(LEVELS)}")
    return level if level in BUILDS else BUILDS[-1]


def cap(isa: str) -> Callable[[], None]:
    """Make torch report no ISA above `isa` (AMX hidden below `amx`), for this process. Returns the
    undo; a kernel library vLLM loaded meanwhile stays loaded (a process holds it for life)."""
    import torch

    if isa not in LEVELS:
        raise ValueError(f"{ENV}={isa!r}: expected one of {', '.join(LEVELS)}")
    rank = LEVELS.index(isa)
    saved = {}
    for name, needs in _PROBES.items():
        if hasattr(torch.cpu, name) and (needs is None or LEVELS.index(needs) > rank):
            saved[name] = getattr(torch.cpu, name)
            setattr(torch.cpu, name, _no)

    def undo() -> None:
        for name, fn in saved.items():
            setattr(torch.cpu, name, fn)

    return undo


def _no() -> bool:
    return False


def cap_from_env() -> str | None:
    """Apply the cap ENV names, if any; returns it."""
    isa = os.environ.get(ENV) or None
    if isa:
        cap(isa)
    return isa


def child_env(isa: str) -> dict[str, str]:
    """What a child process (vLLM server, collective rank) needs to run capped at `isa`: the
    cap, and compile caches of its own. Inductor's cache key leaves out the vector ISA it
    picked: a capped process reusing kernels an uncapped one cached gets code for the other
    width (seen here: vLLM's vocab-parallel embedding mask returned garbage token ids, the
    server died with "index out of range"). A real AVX2-only machine never mixes the two."""
    import tempfile

    user = os.environ.get("USER") or str(os.getuid())
    return {ENV: isa,
            "TORCHINDUCTOR_CACHE_DIR": os.path.join(tempfile.gettempdir(),
                                                    f"torchinductor_{user}_isa_{isa}"),
            "VLLM_CACHE_ROOT": os.path.join(os.path.expanduser("~"), ".cache", f"vllm_isa_{isa}")}


def site_dir() -> Path:
    """A folder whose sitecustomize.py applies ENV's cap at interpreter start (for PYTHONPATH)."""
    return Path(__file__).resolve().parent / "_isa_site"


def builds(pid: int | str = "self") -> list[str]:
    """The vLLM CPU kernel builds (LEVELS names) mapped into process `pid`, from its maps."""
    try:
        text = Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return []
    found = set()
    for line in text.splitlines():
        path = line.rsplit(" ", 1)[-1]
        if "/vllm/" not in path or not path.endswith(".so"):
            continue
        lib = Path(path).name.split(".", 1)[0]
        if lib in LIBRARY:
            found.add(LIBRARY[lib])
    return sorted(found, key=BUILDS.index)


NOT_CPU = "n/a (not vLLM's CPU build)"


def describe(found: list[str]) -> str:
    """The tag value for a process's builds: 'avx2', or 'none loaded', or several joined."""
    return "+".join(found) if found else "none loaded"


def load() -> str:
    """Load vLLM's kernels as vLLM does (its platform's choice) and return which CPU build this
    process holds (NOT_CPU for a GPU build, whose one `_C` is not chosen by ISA). Under the
    cap ENV names, if any: a process started capped never loads a build above it."""
    from vllm.platforms import current_platform

    cap_from_env()

    current_platform.import_kernels()
    return describe(builds()) if current_platform.is_cpu() else NOT_CPU
