"""Reading measured values out of runs, shared by the report's sections: the model a run
measured, log-log interpolation between measured points, which burst figure and which GEMM
kernel match what the server ran, which of a GEMM's two timings a budget uses, and whether
the campaign's server ran on one rank.

    isolated       <label>/<kernel>/latency_us: one call between two CUDA events (an L2
                   flush before it); on a GPU each such call pays a fixed cost (~7 µs on the
                   H200) that the server's CUDA graph does not
    in-stream      <label>/<kernel>/latency_us_instream: K calls back to back in one CUDA
                   graph over rotating weight copies that together exceed 2 × L2, ÷ K: the
                   call as the server's graph runs it (the gemm runner logs it on CUDA, beside
                   the isolated figure; the MoE layer's as moe.tp<N>/<kernel>/..., step =
                   tokens). A budget uses the in-stream figure where the run has one at that
                   M (or between two of its points), else the isolated one, and says which
    world size 1   the served runs (macro, profile) ran the server on one rank (server.tp 1;
                   hardware.world_size where a run has no server.tp): the step has no
                   collectives and no peer to wait for, so both are 0 ms, not missing
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any, Optional

from k25exp.report.sources import Campaign
from k25exp.tracking.read import RunView

ISOLATED = "latency_us"
INSTREAM = "latency_us_instream"
HOW = {ISOLATED: "isolated", INSTREAM: "in-stream"}
ONE_RANK = "world size 1: no collectives, no peer to wait for: 0 ms"
SERVED_PHASES = ("macro", "profile")

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


def logged(run: RunView, key: str) -> dict[int, float]:
    """The key's history, asked of the store only when the run logged the key (a run read
    from MLflow lists every key it logged in its metrics; a hand-built one may hold steps)."""
    if run.loader is not None and key not in run.metrics:
        return {}
    return run.history(key)


def timed_us(run: RunView, prefix: str, x: float) -> dict[str, Optional[float]]:
    """{isolated, in-stream} µs of `<prefix>/latency_us` and `<prefix>/latency_us_instream`
    at x (M or tokens), log-log between the run's points, None outside them."""
    return {HOW[f]: interp_loglog(logged(run, f"{prefix}/{f}"), x) for f in (ISOLATED, INSTREAM)}


def used_us(run: RunView, prefix: str, x: float) -> tuple[Optional[float], str]:
    """(µs, "in-stream" | "isolated") at x: the in-stream figure where the run has it, else
    the isolated one; (None, "") when neither covers x."""
    t = timed_us(run, prefix, x)
    for how in ("in-stream", "isolated"):
        if t[how] is not None:
            return t[how], how
    return None, ""


def served_world(c: Campaign) -> Optional[tuple[int, RunView]]:
    """(ranks, run): how many ranks the campaign's server ran on, as its newest served run
    (macro, else profile) says: server.tp, else hardware.world_size; None when none says."""
    for phase in SERVED_PHASES:
        for r in c.of(phase, None):
            n = r.param("server.tp", int) or r.param("hardware.world_size", int)
            if n is not None:
                return n, r
    return None


def one_rank(c: Campaign) -> Optional[RunView]:
    """The served run that shows the campaign's server ran on one rank (world size 1), or
    None when it ran on more (or no served run says)."""
    w = served_world(c)
    return w[1] if w is not None and w[0] == 1 else None


def needs_gpus(what: str, run: RunView) -> str:
    """Why a figure only two or more GPUs can give is missing from a one-rank campaign."""
    return (f"missing: needs two or more GPUs ({what}); this campaign's server ran on one "
            f"rank (world size 1, run {run.short})")


def served_with_graphs(c: Campaign) -> bool:
    """Whether the campaign's server ran CUDA graphs (server.enforce_eager false)."""
    served = [r for r in c.runs if r.phase in ("macro", "profile")]
    return any(r.params.get("server.enforce_eager") in ("False", "false") for r in served)


def burst_key(c: Campaign, run: Optional[RunView]) -> str:
    """The burst figure that matches the served config: the CUDA-graph replay when the server
    ran graphs and the run has one; else the queued burst's transport where the run split it
    at each op's last arrival (vLLM's CPU communicator: k25exp.collectives.results), as the
    profile splits the server's collectives (its wait is a part of its own, from the profile:
    counting the burst's wait too would count a wait twice); else the whole queued burst."""
    if run is not None and "graph_burst_ms" in run.metrics and served_with_graphs(c):
        return "graph_burst_ms"
    if run is not None and "burst_transport_ms" in run.metrics:
        return "burst_transport_ms"
    return "burst_ms"


def auto_kernel(run: RunView, label: str) -> Optional[str]:
    """The kernel the server would run: the fastest W4A16 serving kernel at M = 1 (Marlin or
    torch's int4, never the w4a16_reference oracle; compared by the figure a budget uses, the
    in-stream one where timed; None when neither was timed at M = 1) for the GEMMs an INT4
    checkpoint quantizes (the routed experts: conf/model/kimi_k25_int4.yaml), the baseline
    otherwise."""
    baseline = run.param("experiment.baseline", str, "torch_bf16")
    method = run.params.get("model.quant.method", "none")
    if method in ("none", "") or label.split(".")[0] not in QUANTIZED:
        # vLLM's own dispatch of a bf16 linear (its CPU build packs weights) when timed
        return "vllm_linear" if 1 in run.history(f"{label}/vllm_linear/latency_us") else baseline
    best = None
    for k in W4A16:
        if f"{label}/{k}/{ISOLATED}" not in run.metrics and f"{label}/{k}/{INSTREAM}" not in run.metrics:
            continue
        us, _ = used_us(run, f"{label}/{k}", 1)
        if us is not None and (best is None or us < best[1]):
            best = (k, us)
    return best[0] if best else None
