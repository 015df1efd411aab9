"""The decode step's collectives timed inside the server's own TP workers.

The torchrun burst (k25exp.collectives) times the step's collectives in processes of its own.
On vLLM's CPU build that is not what the server runs: its workers share their cores with the
engine's busy-polling core process, the API server and one gloo group per parallel group, and
the measured op times differ (docs/report.md, "On vLLM's AVX2 build"). This probe runs the
same sequence of ops through vLLM's own tensor-parallel group (`tensor_model_parallel_*`, the
calls the model makes) in the serving workers, reached by vLLM's `/collective_rpc` dev
endpoint (the server runs with `--worker-extension-cls` naming k25exp's worker extension,
k25exp.serving.worker_extension, which mixes `CollectiveProbe` in).

Timing: per burst, a barrier on the TP group's CPU group, then every op back to back, each
op's [start, end] on CLOCK_MONOTONIC (time.perf_counter_ns; the ranks share the host's clock),
as the torchrun burst marks vLLM's synchronous CPU ops; split at each op's last arrival by
k25exp.collectives.results.split_bursts. Eager, blocking (CPU ops return when done; on CUDA
the op is followed by a synchronize, which the server's graphs do not do: CPU only in the
budget).
"""

from __future__ import annotations

import json
import time
from typing import Optional, Sequence

METHOD = "k25exp_step_burst"


class CollectiveProbe:
    """Mixed into vLLM's worker class (vLLM's worker_extension_cls): `self` is the worker."""

    def k25exp_step_burst(self, spec: str) -> dict:
        import torch
        import torch.distributed as dist
        from vllm.distributed import (get_tp_group, tensor_model_parallel_all_gather,
                                      tensor_model_parallel_all_reduce,
                                      tensor_model_parallel_gather)

        s = json.loads(spec)
        tp = get_tp_group()
        device = getattr(self, "device", torch.device("cpu"))
        dtype = getattr(torch, s["dtype"])
        bufs = {(op, n): torch.ones(n, dtype=dtype, device=device) for op, n in s["ops"]}
        run = {"all_reduce": tensor_model_parallel_all_reduce,
               "all_gather": lambda t: tensor_model_parallel_all_gather(t, dim=0),
               "gather": lambda t: tensor_model_parallel_gather(t, dst=0, dim=0)}
        ops = [(run[op], bufs[(op, n)]) for op, n in s["ops"]]

        def sync():
            if device.type == "cuda":
                torch.cuda.synchronize(device)

        def burst(marks: Optional[list]) -> None:
            dist.barrier(group=tp.cpu_group)
            for fn, t in ops:
                t0 = time.perf_counter_ns()
                fn(t)
                sync()
                if marks is not None:
                    marks.append([t0, time.perf_counter_ns()])

        check = tensor_model_parallel_all_reduce(torch.ones(4, dtype=dtype, device=device))
        for _ in range(int(s.get("warmup", 5))):
            burst(None)
        out: list = []
        for _ in range(int(s["reps"])):
            marks: list = []
            burst(marks)
            out.append(marks)
        return {"rank": tp.rank_in_group, "world": tp.world_size, "marks_ns": out,
                "check_ok": bool((check.float() == tp.world_size).all()),
                "device": str(device)}


def run_in_server(base_url: str, ops: Sequence[tuple[str, int]], dtype: str, reps: int,
                  warmup: int = 5, timeout_s: float = 600.0) -> list[dict]:
    """Every TP worker's answer (rank order) to one probe call through /collective_rpc (a dev
    endpoint: loopback servers only, k25exp.config.dev_endpoints)."""
    from k25exp.serving import worker_rpc

    spec = {"ops": [[op, int(n)] for op, n in ops], "dtype": dtype, "reps": reps, "warmup": warmup}
    results = worker_rpc.call(base_url, METHOD, spec, timeout_s)
    bad = [x for x in results if not isinstance(x, dict)]
    if bad or not results:
        raise RuntimeError(f"POST /collective_rpc: the workers did not run {METHOD} (is the "
                           "server launched with k25exp's --worker-extension-cls?): "
                           f"{str(bad or results)[:300]}")
    return sorted(results, key=lambda x: x["rank"])


def summarise(results: list[dict]) -> dict[str, float]:
    """Figures of the in-server bursts (server_burst_*), each a median over the bursts:
    the burst (per burst the slowest rank's first start to last end), its wait and
    transport (split at each op's last arrival, mean over ranks: split_bursts), and the
    single ops' time (end − start on each rank) at p50 / p90 with their sample count."""
    from k25exp.collectives.results import split_bursts
    from k25exp.stats import median, percentile

    marks = [x["marks_ns"] for x in results]
    bursts = len(marks[0])
    total = [max(m[b][-1][1] - m[b][0][0] for m in marks) / 1e6 for b in range(bursts)]
    split = split_bursts(marks) or []
    ops = [(o[1] - o[0]) / 1e6 for m in marks for b in m for o in b]
    out = {"server_burst_ms": median(total), "server_burst_bursts": float(bursts),
           "server_burst_ops": float(len(marks[0][0])),
           "server_burst_op_ms_p50": percentile(ops, 50),
           "server_burst_op_ms_p90": percentile(ops, 90),
           "server_burst_op_samples": float(len(ops)),
           "server_burst_wrong_ranks": float(sum(not x.get("check_ok") for x in results))}
    if split:
        out["server_burst_wait_ms"] = median([w for w, _ in split]) * 1e3
        out["server_burst_transport_ms"] = median([t for _, t in split]) * 1e3
    return out
