"""What the vLLM server says about how it runs, read from its own log at startup: the
attention backend it picked, eager or compiled, and its CUDA-graph mode. Two runs that differ
here time different code, so these are tags the compare's environment diff shows."""

from __future__ import annotations

import re
from pathlib import Path

_BACKEND = re.compile(r"Using (\w+) backend\.")
_EAGER = re.compile(r"enforce_eager=(True|False)")
_MODE = re.compile(r"'mode': (?:<CompilationMode\.(\w+)|(\d+))")
_CUDAGRAPH = re.compile(r"'cudagraph_mode': <CUDAGraphMode\.(\w+)")
# vLLM's CompilationMode values, for logs that print the number
_MODES = {"0": "NONE", "1": "STOCK_TORCH_COMPILE", "2": "DYNAMO_TRACE_ONCE", "3": "VLLM_COMPILE"}
UNKNOWN = "unknown (not in the server log)"


def facts(text: str) -> dict[str, str]:
    backends = list(dict.fromkeys(_BACKEND.findall(text)))
    out = {"vllm.attention_backend": ", ".join(backends) or UNKNOWN}
    if m := _EAGER.search(text):
        out["vllm.enforce_eager"] = m.group(1).lower()
    if m := _MODE.search(text):
        out["vllm.compilation_mode"] = m.group(1) or _MODES.get(m.group(2), m.group(2))
    if m := _CUDAGRAPH.search(text):
        out["vllm.cudagraph_mode"] = m.group(1)
    for k in ("vllm.enforce_eager", "vllm.compilation_mode", "vllm.cudagraph_mode"):
        out.setdefault(k, UNKNOWN)
    return out


def log_facts(path: Path | None) -> dict[str, str]:
    """Facts from a managed server's whole log (a reused server logged them at its start)."""
    if path is None or not Path(path).exists():
        return {}
    return facts(Path(path).read_text(errors="replace"))
