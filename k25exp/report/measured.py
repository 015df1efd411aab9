"""Reading measured values out of runs, shared by the report's sections: the model a run
measured, log-log interpolation between measured points, which burst figure and which GEMM
kernel match what the server ran."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any, Optional

from k25exp.report.sources import Campaign, RunView

# W4A16 kernels a server runs; w4a16_reference (dequantize + matmul) is the correctness
# oracle, never what a server runs, so it is never picked for a budget
W4A16 = ("marlin", "torch_int4")
QUANTIZED = ("expert_gate_up", "expert_down")  # what Kimi's INT4 checkpoints quantize


def model_of(run: RunView) -> SimpleNamespace:
    """The model config a run measured, from its flattened `model.*` params."""
    vals: dict[str, Any] = {}
    for k, v in run.params.items():
        if k.startswith("model.") and k.count(".") == 1:
            for cast in (int, float):
                try:
                    v = cast(v)
                    break
                except ValueError:
                    continue
            vals[k[6:]] = v
    return SimpleNamespace(**vals)


def interp_loglog(points: dict[int, float], x: float) -> Optional[float]:
    """y at x between measured points (log-log linear); None outside their range."""
    xs = sorted(p for p in points if p > 0 and points[p] is not None and points[p] > 0)
    if not xs or x < xs[0] or x > xs[-1]:
        return None
    if x in points:
        return points[x]
    hi = next(i for i, p in enumerate(xs) if p > x)
    x0, x1 = xs[hi - 1], xs[hi]
    y0, y1 = points[x0], points[x1]
    f = (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0))
    return math.exp(math.log(y0) + f * (math.log(y1) - math.log(y0)))


def served_with_graphs(c: Campaign) -> bool:
    """Whether the campaign's server ran CUDA graphs (server.enforce_eager false)."""
    served = [r for r in c.runs if r.phase in ("macro", "profile")]
    return any(r.params.get("server.enforce_eager") in ("False", "false") for r in served)


def burst_key(c: Campaign, run: Optional[RunView]) -> str:
    """The burst figure that matches the served config: the CUDA-graph replay when the server
    ran graphs and the run has one, else the eager queued burst."""
    if run is not None and "graph_burst_ms" in run.metrics and served_with_graphs(c):
        return "graph_burst_ms"
    return "burst_ms"


def auto_kernel(run: RunView, label: str) -> Optional[str]:
    """The kernel the server would run: the fastest W4A16 serving kernel (Marlin or torch's
    int4, never the w4a16_reference oracle; None when neither was timed at M = 1) for the
    GEMMs an INT4 checkpoint quantizes (the routed experts: conf/model/kimi_k25_int4.yaml),
    the baseline otherwise."""
    baseline = run.param("experiment.baseline", str, "torch_bf16")
    method = run.params.get("model.quant.method", "none")
    if method in ("none", "") or label.split(".")[0] not in QUANTIZED:
        # vLLM's own dispatch of a bf16 linear (its CPU build packs weights) when timed
        return "vllm_linear" if 1 in run.history(f"{label}/vllm_linear/latency_us") else baseline
    best = None
    for k in W4A16:
        key = f"{label}/{k}/latency_us"
        if key in run.metrics and 1 in run.history(key):
            if best is None or run.history(key)[1] < best[1]:
                best = (k, run.history(key)[1])
    return best[0] if best else None
