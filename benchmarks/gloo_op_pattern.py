"""How long one small gloo all-reduce takes depends on what the rank did just before it.

    torchrun --nproc-per-node 2 -m benchmarks.gloo_op_pattern [--ops 3000] [--bytes 1024]

Each rank is pinned to one CPU (rank r on the r-th CPU this process may use, as vLLM's CPU
build pins its TP workers), its gloo group created after pinning (so gloo's event loop and
worker threads share that CPU, as in the server), and times the same all-reduce under three
patterns: back to back; after a compute gap (a bf16 matmul loop, as a layer's work between
two of the step's collectives); after a sleep of the same length (the core idles). Timer:
time.perf_counter_ns around each blocking call, after 200 warm-up ops; one barrier before
each pattern. Rank 0 prints one row per pattern: p50 / mean / p90 / p99 in ms over `--ops`
samples. The micro-benchmark's burst (nccl_burst) times the first pattern; the server's step
issues its collectives between the layers' work.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist


def _matmul_for(us: float, a: torch.Tensor, b: torch.Tensor) -> None:
    end = time.perf_counter_ns() + us * 1e3
    while time.perf_counter_ns() < end:
        torch.mm(a, b)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ops", type=int, default=3000)
    ap.add_argument("--bytes", type=int, default=1024)
    ap.add_argument("--gaps-us", default="300,1000,3000", help="gap lengths, µs")
    a = ap.parse_args()
    rank = int(os.environ["RANK"])
    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpus[int(os.environ.get("LOCAL_RANK", rank)) % len(cpus)]})
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    x = torch.ones(a.bytes // 2, dtype=torch.bfloat16)
    m1, m2 = torch.randn(256, 256), torch.randn(256, 256)
    for _ in range(200):
        dist.all_reduce(x)
    patterns = [("back to back", None)]
    for g in (float(v) for v in a.gaps_us.split(",")):
        patterns += [(f"after {g:.0f} µs of matmul", lambda g=g: _matmul_for(g, m1, m2)),
                     (f"after {g:.0f} µs of sleep", lambda g=g: time.sleep(g / 1e6))]
    if rank == 0:
        print(f"{'pattern':<26}{'p50 ms':>9}{'mean ms':>9}{'p90 ms':>9}{'p99 ms':>9}{'n':>7}")
    for name, before in patterns:
        dist.barrier()
        lat = []
        for _ in range(a.ops):
            if before:
                before()
            t = time.perf_counter_ns()
            dist.all_reduce(x)
            lat.append((time.perf_counter_ns() - t) / 1e6)
        lat.sort()
        n = len(lat)
        if rank == 0:
            print(f"{name:<26}{lat[n // 2]:>9.3f}{sum(lat) / n:>9.3f}{lat[int(0.9 * n)]:>9.3f}"
                  f"{lat[int(0.99 * n)]:>9.3f}{n:>7}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
