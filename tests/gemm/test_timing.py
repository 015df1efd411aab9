from __future__ import annotations

import pytest
import torch

from k25exp.gemm.kernels import torch_bf16
from k25exp.gemm.quant import random_weight
from k25exp.gemm.timing import Timing, rotation, time_cpu, time_cuda, time_cuda_instream, time_fn

CUDA = torch.cuda.is_available()


def test_timing_properties():
    t = Timing([3.0, 1.0, 2.0, 10.0], {"timer": "x"})
    assert t.median_us == 2.5 and t.p90_us == pytest.approx(7.9) and t.min_us == 1.0
    assert t.mean_us == 4.0


def gemm():
    w = random_weight(256, 512, seed=0)
    return torch_bf16().prepare(w, None), torch.randn(4, 512).to(torch.bfloat16)


def test_time_cpu():
    fn, x = gemm()
    t = time_cpu(fn, x, warmup=2, calls=9)
    assert len(t.samples_us) == 9 and all(s > 0 for s in t.samples_us)
    assert min(t.samples_us) <= t.median_us <= t.p90_us <= max(t.samples_us)
    assert t.method["timer"] == "perf_counter_ns"
    assert t.method["threads"] == torch.get_num_threads()
    assert (t.method["warmup"], t.method["calls"]) == (2, 9)
    assert t.method["flush_l2"] is False


def test_time_fn_dispatch_cpu():
    fn, x = gemm()
    t = time_fn(fn, x, "cpu", warmup=0, calls=3, flush_l2=True)
    assert len(t.samples_us) == 3 and t.method["device"] == "cpu" and t.method["flush_l2"] is False
    assert len(time_fn(fn, x, warmup=1, calls=2).samples_us) == 2  # device from x
    with pytest.raises(ValueError, match="CUDA"):
        time_fn(fn, x, "cpu", warmup=0, calls=1, graph=True)
    with pytest.raises(ValueError, match="calls"):
        time_cpu(fn, x, warmup=0, calls=0)
    with pytest.raises(ValueError, match="CUDA tensor"):
        time_cuda(fn, x, warmup=0, calls=1)


def test_rotation_copies_exceed_twice_the_l2():
    """By hand: a 2 MB weight against a 60 MB L2 needs 61 copies (122 MB > 120 MB), so 61
    calls at least 32 → 61; a 293 MB lm_head shard needs 2 (the floor); 5 MB: 25 copies,
    32 calls → 50 (two rounds)."""
    mb = 1_000_000
    assert rotation(2 * mb, 60 * mb, 32) == (61, 61)
    assert rotation(293 * mb, 60 * mb, 32) == (2, 32)
    assert rotation(5 * mb, 60 * mb, 32) == (25, 50)
    assert rotation(1000, 60 * mb, 32, max_copies=512) == (512, 512)
    with pytest.raises(ValueError, match="weight_bytes"):
        rotation(0, 60 * mb, 32)


@pytest.mark.cuda
def test_in_stream_timing_is_a_replay_divided_by_its_calls():
    """K calls in one graph: K = 64 copies of kv_b_proj-like 2 MB weights, each sample one
    replay / K. Back to back the per-call time must come out below the isolated call's
    (which pays the two events' fixed cost), and the method says how it was taken."""
    x = torch.randn(1, 512, device="cuda").to(torch.bfloat16)
    ws = [random_weight(2048, 512, seed=i, device="cuda") for i in range(64)]
    calls = [lambda w=w: torch.nn.functional.linear(x, w) for w in ws]
    t = time_cuda_instream(calls, replays=20, warmup=2)
    iso = time_fn(lambda a: torch.nn.functional.linear(a, ws[0]), x, "cuda", warmup=3, calls=20)
    assert len(t.samples_us) == 20 and t.method["calls_per_graph"] == 64
    assert t.method["mode"] == "graph_instream" and t.method["flush_l2"] is False
    assert t.median_us < iso.median_us


@pytest.mark.cuda
@pytest.mark.parametrize("graph", [False, True])
def test_time_cuda(graph):
    w = random_weight(4096, 7168, seed=0, device="cuda")
    fn = torch_bf16().prepare(w, None)
    x = torch.randn(16, 7168, device="cuda").to(torch.bfloat16)
    t = time_fn(fn, x, "cuda", warmup=3, calls=20, graph=graph)
    assert len(t.samples_us) == 20 and all(s > 0 for s in t.samples_us)
    assert t.method["timer"] == "cuda_event" and t.method["mode"] == ("graph" if graph else "eager")
    assert t.method["flush_l2"] is True and t.method["flush_bytes"] == 256 * 2**20


@pytest.mark.cuda
def test_the_first_calls_cost_stays_in_the_warm_up():
    """A kernel whose first call pays a JIT-like cost (a ~0.1 s GPU spin): the warm-up takes
    it, and no timed sample shows it, even with warmup=0."""
    x = torch.ones(1024, device="cuda")
    seen = []

    def fn(a):
        seen.append(1)
        if len(seen) == 1:
            torch.cuda._sleep(200_000_000)  # GPU cycles: ~0.1 s at ~2 GHz
        return a * 2

    t = time_cuda(fn, x, warmup=0, calls=20, flush_l2=False, warmup_ms=25)
    assert t.method["warmup"] == 0 and t.method["warmup_ms"] == 25  # how, as configured
    assert t.warmup_calls >= 1 and len(seen) == t.warmup_calls + 20  # what it took
    assert max(t.samples_us) < 10_000
