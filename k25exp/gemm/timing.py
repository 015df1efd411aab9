"""Per-call timing of a GEMM function, with the method written down next to the numbers.

Every sample is one call timed on its own (never n calls divided by n), so the spread is
visible; ``Timing.method`` says which clock, how many warm-ups, whether L2 was flushed and
whether launches were replayed from a CUDA graph. Those choices answer different questions
(cold-cache kernel time vs back-to-back throughput), so they travel with the figures.

The one exception is named as such: ``time_cuda_instream`` times K calls back to back in one
CUDA graph over rotating weight copies and divides by K, because that is how the server's
graph runs them; an isolated call between two events pays a fixed cost the server does not.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch
from torch import Tensor

from k25exp.stats import percentile

# triton.testing.do_bench flushes 256 MB too: several times the H200's 60 MB L2, so
# no weight bytes survive from one call to the next.
L2_FLUSH_BYTES = 256 * 1024 * 1024

MethodValue = str | int | float | bool


@dataclass
class Timing:
    samples_us: list[float]
    method: dict[str, MethodValue] = field(default_factory=dict)  # how: the same for every figure timed alike
    warmup_calls: int = 0  # what the warm-up took (warmup_ms makes it vary by figure)

    @property
    def median_us(self) -> float:
        return percentile(self.samples_us, 50)

    @property
    def p90_us(self) -> float:
        return percentile(self.samples_us, 90)

    @property
    def min_us(self) -> float:
        return min(self.samples_us)

    @property
    def mean_us(self) -> float:
        return sum(self.samples_us) / len(self.samples_us)


def _check_counts(warmup: int, calls: int) -> None:
    if warmup < 0 or calls < 1:
        raise ValueError(f"need warmup >= 0 and calls >= 1, got warmup={warmup} calls={calls}")


def time_cpu(fn: Callable[[Tensor], Tensor], x: Tensor, warmup: int, calls: int) -> Timing:
    """Wall-clock time of each call (time.perf_counter_ns). CPU ops are synchronous, so the
    call's return is the work's end. Caches are not flushed: report it as warm-cache time."""
    _check_counts(warmup, calls)
    for _ in range(warmup):
        fn(x)
    samples = []
    for _ in range(calls):
        t0 = time.perf_counter_ns()
        fn(x)
        samples.append((time.perf_counter_ns() - t0) / 1e3)
    return Timing(samples, {
        "timer": "perf_counter_ns", "device": "cpu", "threads": torch.get_num_threads(),
        "warmup": warmup, "calls": calls, "mode": "eager", "flush_l2": False,
    })


def time_cuda(
    fn: Callable[[Tensor], Tensor], x: Tensor, warmup: int, calls: int,
    flush_l2: bool = True, graph: bool = False, warmup_ms: float = 0.0,
) -> Timing:
    """GPU time of each call between two CUDA events on the current stream.

    flush_l2: zero a 256 MiB buffer before each timed call, outside its events, so the
    weights come from HBM as they do in a model where other layers run in between.
    graph: capture ``fn(x)`` once in a CUDA graph and time ``replay()``, which takes the
    host's launch cost out; eager timing includes a launch gap only where the host falls
    behind the GPU (the flush before each call usually gives the host that head start).
    warmup_ms: after the first call (which pays JIT compilation and autotuning) and `warmup`
    calls, go on warming up until this much wall time has passed since that first call
    ended, as triton's do_bench warms up by time: a first batch size that compiles kernels
    is no slower than the next one (seen: vLLM's fused MoE read 408 µs at c = 1, 168 at 2).
    """
    _check_counts(warmup, calls)
    device = x.device
    if device.type != "cuda":
        raise ValueError(f"time_cuda needs a CUDA tensor, got one on {device}")
    flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device=device) if flush_l2 else None

    if graph:
        # Warm up on a side stream before capture, as the CUDA-graph docs require (lazy
        # init, cuBLAS workspaces and autotuning must not happen inside the capture).
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(max(warmup, 3)):
                fn(x)
        torch.cuda.current_stream(device).wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn(x)  # the output stays in the graph's pool, reused by every replay
        call = g.replay
    else:
        def call() -> None:
            fn(x)

    call()  # the first call: JIT, autotuning, lazy allocations
    torch.cuda.synchronize(device)
    t_first = time.perf_counter()
    done = 1
    while done < warmup or (time.perf_counter() - t_first) * 1e3 < warmup_ms:
        call()
        done += 1
        if done % 8 == 0:  # the queue, not the GPU, would otherwise set the pace
            torch.cuda.synchronize(device)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(calls)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(calls)]
    torch.cuda.synchronize(device)
    for i in range(calls):
        if flush is not None:
            flush.zero_()
        starts[i].record()
        call()
        ends[i].record()
    torch.cuda.synchronize(device)
    samples = [s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends)]  # ms -> us
    return Timing(samples, {
        "timer": "cuda_event", "device": torch.cuda.get_device_name(device),
        "warmup": warmup, "warmup_ms": warmup_ms, "calls": calls,
        "mode": "graph" if graph else "eager",
        "flush_l2": flush_l2, "flush_bytes": L2_FLUSH_BYTES if flush_l2 else 0,
    }, warmup_calls=done)


def l2_bytes(device: torch.device | str) -> int:
    """The GPU's L2 cache size (bytes), as CUDA reports it."""
    return int(torch.cuda.get_device_properties(torch.device(device)).L2_cache_size)


def rotation(weight_bytes: int, l2: int, min_calls: int, max_copies: int = 512) -> tuple[int, int]:
    """(weight copies, calls per graph) for in-stream timing: enough copies that together they
    exceed twice the L2 (no call finds its weights cached by an earlier one, as in a model
    whose other layers run in between), at least 2; calls a multiple of the copies, at least
    min_calls."""
    if weight_bytes <= 0 or min_calls < 1:
        raise ValueError(f"need weight_bytes > 0 and min_calls >= 1, got {weight_bytes}, {min_calls}")
    copies = min(max_copies, max(2, 2 * l2 // weight_bytes + 1))
    return copies, copies * -(-min_calls // copies)


def time_cuda_instream(calls: Sequence[Callable[[], Tensor]], replays: int, warmup: int = 3
                       ) -> Timing:
    """The calls back to back in one CUDA graph, as a server's graph runs its kernels: each
    sample is one replay's time (two CUDA events around it) divided by len(calls). The
    caller makes the calls read rotating weight copies larger than twice the L2 (rotation),
    so no L2 flush is needed. What an isolated call pays once per launch (~7 µs between two
    events on the H200) is spread over the graph instead."""
    if not calls:
        raise ValueError("time_cuda_instream needs at least one call")
    _check_counts(warmup, replays)
    device = torch.cuda.current_device()
    side = torch.cuda.Stream(device)  # warm-up outside capture (autotuning, workspaces)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(max(warmup, 1)):
            for f in calls:
                f()
    torch.cuda.current_stream(device).wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for f in calls:
            f()
    for _ in range(max(warmup, 1)):
        g.replay()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(replays)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(replays)]
    torch.cuda.synchronize(device)
    for i in range(replays):
        starts[i].record()
        g.replay()
        ends[i].record()
    torch.cuda.synchronize(device)
    k = len(calls)
    samples = [s.elapsed_time(e) * 1e3 / k for s, e in zip(starts, ends)]  # ms -> us per call
    del g
    return Timing(samples, {
        "timer": "cuda_event", "device": torch.cuda.get_device_name(device),
        "warmup": warmup, "calls": replays, "mode": "graph_instream", "calls_per_graph": k,
        "flush_l2": False,
    }, warmup_calls=warmup)


def time_fn(fn: Callable[[Tensor], Tensor], x: Tensor, device: torch.device | str | None = None,
            **kw) -> Timing:
    """Dispatch on the device (default: x's): ``time_cuda`` or ``time_cpu``. On the CPU
    ``flush_l2`` and ``warmup_ms`` are ignored (method says flush_l2=False; the CPU warms up by
    count) and ``graph=True`` is an error."""
    dev = torch.device(device) if device is not None else x.device
    if dev.type == "cuda":
        return time_cuda(fn, x, **kw)
    if dev.type == "cpu":
        kw.pop("flush_l2", None)
        kw.pop("warmup_ms", None)
        if kw.pop("graph", False):
            raise ValueError("CUDA-graph timing needs a CUDA device")
        return time_cpu(fn, x, **kw)
    raise ValueError(f"no timer for device type {dev.type!r}")
