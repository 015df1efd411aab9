"""Cross-check k25exp's CUDA GEMM timer against triton.testing.do_bench on the same calls.

    python -m benchmarks.gemm_vs_do_bench [--m 1 16 128] [--iters 100]

Both flush L2 (256 MB) before every timed call and report the median. Prints one row per
(shape, M): ours, do_bench's, and their difference. Needs CUDA and triton; torch only
otherwise (runs on a GPU node without Hydra or MLflow).
"""

from __future__ import annotations

import argparse

import torch
import triton.testing

from k25exp.gemm.kernels import torch_bf16
from k25exp.gemm.quant import random_weight
from k25exp.gemm.timing import time_cuda

# Kimi-K2 expert GEMMs, unsharded (tp 1): gate_up [2·2048 × 7168], down [7168 × 2048].
SHAPES = {"expert_gate_up": (4096, 7168), "expert_down": (7168, 2048)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--m", type=int, nargs="+", default=[1, 16, 128])
    ap.add_argument("--iters", type=int, default=100)
    a = ap.parse_args()
    dev = torch.device("cuda", 0)
    print(f"# {torch.cuda.get_device_name(dev)}, torch {torch.__version__}, triton {triton.__version__}")
    print(f"# {'shape':>16} {'M':>5} {'ours_us':>10} {'do_bench_us':>12} {'diff_%':>8}")
    for name, (n, k) in SHAPES.items():
        fn = torch_bf16().prepare(random_weight(n, k, seed=0, device=dev), None)
        for m in a.m:
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            ours = time_cuda(fn, x, warmup=10, calls=a.iters, flush_l2=True).median_us
            # do_bench takes warm-up and repetition in milliseconds.
            theirs = triton.testing.do_bench(lambda: fn(x), warmup=25, rep=100, return_mode="median") * 1e3
            print(f"  {name:>16} {m:>5} {ours:>10.2f} {theirs:>12.2f} {100 * (ours - theirs) / theirs:>8.1f}")


if __name__ == "__main__":
    main()
