"""GPU figures for the decode-step budget, with torch alone (no vLLM, Hydra or MLflow needed):

1. the decode step's collectives (k25exp.collectives.step) at Kimi's TP-8 sizes, through the
   torchrun worker on every local GPU with NCCL via c10d (vLLM's communicator needs vLLM),
   queued eager, per-kind bursts, per-op blocking, and one CUDA-graph replay of the step;
   beside it the seed's 122 uniform all-reduces;
2. one MoE layer's routed experts at Kimi shapes (384 experts, top-8, H 7168) for c tokens:
   the plain-torch grouped reference (k25exp.gemm.moe, named as such: not vLLM's fused
   kernel) against the old budget's estimate, one expert's bf16 GEMMs × top_k.

    python -m benchmarks.gpu_step_bench OUT_DIR [--tokens 1 8 64] [--batches 1 8 32 128]
Writes OUT_DIR/gpu_step_bench.json and prints a summary.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from k25exp.collectives.results import read_rank_files
from k25exp.collectives.spec import CollectiveSpec, Point
from k25exp.collectives.step import decode_step_ops, uniform_ops
from k25exp.gemm import moe
from k25exp.gemm.timing import time_cuda

KIMI = dict(hidden=7168, layers=61, vocab=163840, experts=384, top_k=8, moe_inter=2048)


def collectives(out: Path, tokens: list[int], iters: int, tp: int) -> list[dict]:
    ngpu = torch.cuda.device_count()
    res = []
    for t in tokens:
        for label, ops in (("step", decode_step_ops(KIMI["hidden"], KIMI["layers"], KIMI["vocab"],
                                                    tp, t, 2)),
                           ("seed122", uniform_ops(122, KIMI["hidden"] * t, 2))):
            d = out / f"coll_{label}_t{t}"
            d.mkdir(parents=True, exist_ok=True)
            spec = CollectiveSpec(op="step", dtype="bfloat16", device="cuda", backend="nccl",
                                  points=[Point(t, ops[0].numel, len(ops), iters, iters * len(ops),
                                                [[o.op, o.numel] for o in ops])],
                                  warmup=5, graph=True)
            spec.dump(d / "spec.json")
            r = subprocess.run([sys.executable, "-m", "torch.distributed.run",
                                f"--nproc-per-node={ngpu}", "-m", "k25exp.collectives.worker",
                                str(d / "spec.json"), str(d / "raw")], capture_output=True, text=True)
            if r.returncode:
                res.append({"label": label, "tokens": t, "error": r.stderr[-2000:]})
                continue
            (p,) = read_rank_files(d / "raw").points
            res.append({"label": label, "tokens": t, "world": ngpu, "ops": len(ops),
                        "bytes_per_step": sum(o.nbytes for o in ops), "wrong": p.wrong,
                        "eager_burst_ms": p.burst_ms, "graph_burst_ms": p.graph_burst_ms,
                        "ms_by_kind_queued": p.step_ms_by_kind(),
                        "blocking_ms_per_step": sum(p.step_ms_by_op().values()),
                        "impl": p.impl})
    return res


def moe_layer(batches: list[int], tps: list[int], iters: int) -> list[dict]:
    dev = torch.device("cuda", 0)
    res = []
    for tp in tps:
        inter = KIMI["moe_inter"] // tp
        w13, w2 = moe.make_weights(KIMI["experts"], KIMI["hidden"], inter, torch.bfloat16, dev, 0)
        for c in batches:
            tw, ti = moe.route(c, KIMI["experts"], KIMI["top_k"], c, dev)
            x = torch.randn(c, KIMI["hidden"], device=dev, dtype=torch.bfloat16)
            prep = moe.reference_grouped_moe(w13, w2)
            ref = time_cuda(lambda a: prep.run(a, tw, ti), x, 5, iters)
            # the old budget: one expert's gate_up and down GEMMs at M = 1 token, × top_k
            x1 = x[:1]
            one = time_cuda(lambda a: F.linear(F.linear(a, w13[0])[:, :inter], w2[0]), x1, 5, iters)
            res.append({"tp": tp, "tokens": c, "experts_touched": int(ti.unique().numel()),
                        "reference_grouped_moe_us": ref.median_us, "reference_p90_us": ref.p90_us,
                        "one_expert_x_topk_us": one.median_us * KIMI["top_k"],
                        "timing": ref.method})
        del w13, w2
        torch.cuda.empty_cache()
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 128])
    ap.add_argument("--tps", type=int, nargs="+", default=[8, 1])
    ap.add_argument("--iters", type=int, default=50)
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    result = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
              "cuda": torch.version.cuda, "gpus": torch.cuda.device_count(),
              "collectives": collectives(a.out / "work", a.tokens, a.iters, tp=8),
              "moe": moe_layer(a.batches, a.tps, a.iters)}
    (a.out / "gpu_step_bench.json").write_text(json.dumps(result, indent=1))
    for r in result["collectives"]:
        print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items() if k != "impl"})
    for r in result["moe"]:
        print({k: (round(v, 2) if isinstance(v, float) else v) for k, v in r.items() if k != "timing"})


if __name__ == "__main__":
    main()
