"""A sweep level run R times (experiment.repeats): the repeats' requests pooled into the
level's figures, and how far the repeats' own figures spread.

Pooling, not averaging: percentiles are over every request of every repeat (their `_n` says
how many), throughput is all tokens over all repeats' wall time. The spread is the repeats'
own headline figures: min, max and (max - min) / median in %.
"""

from __future__ import annotations

from statistics import median
from typing import Sequence

# the figures whose spread over repeats is logged (the headline ones)
SPREAD_KEYS = ("tpot_ms_p50", "ttft_ms_p50", "itl_ms_p50", "e2e_ms_p50", "output_tok_s", "request_s")


def pool(results: Sequence[dict]) -> dict:
    """One phase result from several (run_level / run_open_level's): records concatenated,
    wall and CPU time summed, loop-lag samples concatenated."""
    if len(results) == 1:
        return results[0]
    out = {"records": [r for res in results for r in res["records"]],
           "wall_s": sum(res["wall_s"] for res in results),
           "cpu_s": sum(res["cpu_s"] for res in results),
           "loop_lag_ms": [x for res in results for x in res["loop_lag_ms"]],
           "repeats": list(results)}
    if results[0].get("rate") is not None:  # open loop: each repeat keeps its own schedule
        out["rate"] = results[0]["rate"]
    if results[0].get("scheduled"):  # a trace's schedule (with or without a rate)
        out["scheduled"] = True
    # several client processes (k25exp.load.shards): each process's loop lag across the
    # repeats, and every process that failed
    by_proc = [res.get("loop_lag_ms_by_process") for res in results]
    if all(b is not None and len(b) == len(by_proc[0]) for b in by_proc):
        out["loop_lag_ms_by_process"] = [[x for b in by_proc for x in b[k]]
                                         for k in range(len(by_proc[0]))]
    out["client_failures"] = [w for res in results for w in res.get("client_failures", ())]
    procs = [res["client_processes"] for res in results if "client_processes" in res]
    if procs:
        out["client_processes"] = max(procs)
    return out


def spread(per_repeat: Sequence[dict]) -> dict:
    """`<key>_rep_min`, `_rep_max`, `_rep_spread_pct` for each SPREAD_KEYS figure every repeat
    has, and `repeats` (how many ran)."""
    out: dict = {"repeats": float(len(per_repeat))}
    for k in SPREAD_KEYS:
        vals = [f[k] for f in per_repeat if f.get(k) is not None]
        if len(vals) != len(per_repeat) or len(vals) < 2:
            continue
        mid = median(vals)
        out[f"{k}_rep_min"], out[f"{k}_rep_max"] = min(vals), max(vals)
        if mid:
            out[f"{k}_rep_spread_pct"] = (max(vals) - min(vals)) / mid * 100
    return out
