"""The torchrun worker: one process per rank, measuring one collective over a list of points.

    torchrun --nproc-per-node=N -m k25exp.collectives.worker SPEC.json OUT_DIR

Imports torch alone (and vLLM, when the spec asks for its communicator). Each rank appends JSON lines to OUT_DIR/rank<R>.jsonl and flushes
after every point, so a run that dies half-way keeps every finished point. After each point
rank 0 also gathers every rank's record into OUT_DIR/gathered.jsonl: on several nodes that
is the one complete copy, on node 0.

Timing (host clock, time.perf_counter_ns, on every rank; the reader takes the slowest rank):
- queued: a barrier, then `burst` ops issued back to back (gloo: async work handles waited
  at the end; NCCL: stream-ordered launches, one device sync at the end; vLLM's CPU ops
  return when done). Divided by the burst length this is nccl-tests' per-op time. A point
  with a `sequence` (a decode step's collectives) issues that sequence as its burst; with
  vLLM's CPU communicator each op's start and end are also kept (queued_marks_ns), so the
  reader splits the burst into wait and transport at each op's last arrival.
- blocking: a barrier, then one op, waited for and synchronised; per-op latency. For a
  sequence, each of its ops in turn, pass after pass. After a barrier every rank arrives
  together, so this is the op's transport time, without waiting for a late rank.
- graph (CUDA): the burst captured once in a CUDA graph; one replay timed like a burst.
Correctness is checked outside the timed loops, as nccl-tests does with -c: fresh inputs
whose reduction is exact in every supported dtype, one op, compare on every rank.

Long because it is the one file torchrun runs in every rank: point setup, the four timing
modes and the correctness check must travel together (torch only, no k25exp config).
"""

from __future__ import annotations

import json
import os
import platform
import socket
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Optional

import torch
import torch.distributed as dist

from k25exp.redact import redact_env
from k25exp import vllm_kernels
from k25exp.collectives.comm import TorchComm, make_comm
from k25exp.collectives.spec import CollectiveSpec, Point


class Collective:
    """Buffers and the op for one message; `run(async_op)` issues the op once through `comm`."""

    def __init__(self, op: str, numel: int, dtype: torch.dtype, device: torch.device, world: int,
                 comm=None):
        self.op, self.world = op, world
        self.comm = comm if comm is not None else TorchComm()
        self.send = torch.zeros(numel, dtype=dtype, device=device)
        self.recv = {"all_to_all": lambda: torch.zeros(numel, dtype=dtype, device=device),
                     "all_gather": lambda: torch.zeros(numel * world, dtype=dtype, device=device),
                     }.get(op, lambda: None)()
        self.out = self.send

    @property
    def nbytes(self) -> int:
        """nccl-tests' S: the buffer (all-reduce, all-to-all), the gathered output (all-gather)."""
        return self.send.numel() * self.send.element_size() * (self.world if self.op == "all_gather" else 1)

    def run(self, async_op: bool = False):
        work, self.out = self.comm.run(self.op, self.send, self.recv, async_op)
        return work

    # Inputs are small integers, so every partial sum is exact in bf16/fp16/int8 and the
    # check can demand equality: an allreduce sums at most 8 × 10 × 3 = 240 < 256.
    def fill(self, rank: int) -> None:
        n = self.send.numel()
        idx = torch.arange(n, device=self.send.device)
        if self.op in ("all_reduce", "all_gather"):
            pattern = (idx % 3 + 1) * (rank % 4 + 1)
        else:
            chunk = n // self.world
            dest = idx // chunk
            pattern = (rank * self.world + dest) % 100 + 1
        self.send.copy_(pattern.to(self.send.dtype))

    def expected(self, rank: int) -> torch.Tensor:
        n = self.send.numel()
        idx = torch.arange(n, device=self.send.device)
        if self.op == "all_reduce":
            factor = sum(r % 4 + 1 for r in range(self.world))
            return ((idx % 3 + 1) * factor).to(self.send.dtype)
        if self.op == "all_gather":  # rank r's block is r's pattern
            return torch.cat([(idx % 3 + 1) * (r % 4 + 1) for r in range(self.world)]).to(self.send.dtype)
        chunk = n // self.world
        src = idx // chunk
        return ((src * self.world + rank) % 100 + 1).to(self.send.dtype)

    def result(self) -> torch.Tensor:
        return self.out


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _barrier(device: torch.device) -> None:
    dist.barrier()
    _sync(device)


def time_queued(ops: list[Collective], device: torch.device, marks: Optional[list] = None) -> float:
    """One burst: every op of `ops` issued back to back, one wait / sync at the end.

    `marks` (a list), for ops that return when done (vLLM's CPU communicator): each op's
    [start, end] on this host's monotonic clock (ns) is appended, so the reader can split the
    burst at each op's last arrival across ranks, as the trace analyser splits the server's."""
    _barrier(device)
    t0 = time.perf_counter_ns()
    if marks is not None:
        for c in ops:
            t = time.perf_counter_ns()
            c.run()
            marks.append([t, time.perf_counter_ns()])
    elif device.type == "cuda":
        for c in ops:
            c.run()  # enqueued on the current stream; the host does not wait
    else:
        works = [c.run(async_op=True) for c in ops]
        for w in works:
            if w is not None:  # vLLM's CPU ops return when done
                w.wait()
    _sync(device)
    return (time.perf_counter_ns() - t0) / 1e9


def thread_sched() -> dict[str, list[int]]:
    """This process's threads by name (Linux schedstat): [CPU ns, run-queue wait ns, time
    slices], summed over the threads of one name; {} where /proc has no schedstat. On a rank
    pinned to one core (as the server's are), gloo's event loop, its workers and the caller
    share that core, and a thread woken while another runs waits in the run queue."""
    out: dict[str, list[int]] = {}
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return out
    for t in tasks:
        try:
            name = Path(f"/proc/self/task/{t}/comm").read_text().strip()
            run, wait, slices = map(int, Path(f"/proc/self/task/{t}/schedstat").read_text().split())
        except (OSError, ValueError):
            continue  # a thread gone meanwhile, or no schedstat in this kernel
        acc = out.setdefault(name, [0, 0, 0])
        acc[0] += run
        acc[1] += wait
        acc[2] += slices
    return out


def time_blocking(c: Collective, device: torch.device) -> float:
    _barrier(device)
    t0 = time.perf_counter_ns()
    c.run()
    _sync(device)
    return (time.perf_counter_ns() - t0) / 1e9


def capture_graph(ops: list[Collective], device: torch.device, comm) -> "torch.cuda.CUDAGraph":
    with comm.graph_context(device):
        # Warm up on a side stream before capture, as torch.cuda.graphs requires.
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(3):
                for c in ops:
                    c.run()
        torch.cuda.current_stream(device).wait_stream(side)
        _sync(device)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for c in ops:
                c.run()
        _sync(device)
    return g


def time_graph(g, device: torch.device) -> float:
    _barrier(device)
    t0 = time.perf_counter_ns()
    g.replay()
    _sync(device)
    return (time.perf_counter_ns() - t0) / 1e9


def check(c: Collective, rank: int, device: torch.device, corrupt: bool = False) -> dict:
    c.fill(rank)
    if c.recv is not None:
        c.recv.zero_()
    c.run()
    _sync(device)
    if corrupt:  # test hook (experiment.fault.corrupt_rank)
        c.result()[0] += 1
    got, want = c.result(), c.expected(rank)
    bad = (got != want).nonzero()
    out = {"wrong": int(bad.numel())}
    if bad.numel():
        i = int(bad[0])
        out.update(first_wrong_index=i, got=float(got[i]), expected=float(want[i]))
    return out


def burst_ops(spec: CollectiveSpec, p: Point, world: int, device: torch.device, comm) -> list[Collective]:
    """The ops of one burst: `burst` × the point's op, or the point's sequence (one buffer per
    distinct op and size, reused wherever it recurs, as a model reuses its activations)."""
    dtype = getattr(torch, spec.dtype)
    if not p.sequence:
        return [Collective(spec.op, p.numel, dtype, device, world, comm)] * p.burst
    distinct: dict[tuple, Collective] = {}
    for op, numel in p.sequence:
        if (op, numel) not in distinct:
            distinct[(op, numel)] = Collective(op, numel, dtype, device, world, comm)
    return [distinct[(op, numel)] for op, numel in p.sequence]


def measure_point(spec: CollectiveSpec, p: Point, rank: int, world: int, device: torch.device,
                  comm=None) -> dict:
    comm = comm if comm is not None else TorchComm()
    ops = burst_ops(spec, p, world, device, comm)
    distinct = list(dict.fromkeys(ops))
    rec: dict = {"kind": "point", "rank": rank, "label": p.label, "numel": p.numel,
                 "bytes": sum(c.nbytes for c in ops) if p.sequence else ops[0].nbytes,
                 "burst": len(ops)}
    if p.sequence:
        rec["sequence_bytes"] = [c.nbytes for c in ops]
        rec["sequence_ops"] = [c.op for c in ops]
    if rank == 0:
        rec["impl"] = comm.describe([(f"{c.op} {c.nbytes} B", c.send) for c in distinct])
    if spec.check:
        wrong = [{**check(c, rank, device, corrupt=spec.fault_corrupt_rank == rank),
                  "wrong_op": c.op, "wrong_bytes": c.nbytes} for c in distinct]
        rec.update(next((w for w in wrong if w["wrong"]), wrong[0]))
        rec["wrong"] = sum(w["wrong"] for w in wrong)
        total_wrong = torch.tensor([rec["wrong"]], dtype=torch.int64, device=device)
        dist.all_reduce(total_wrong)  # c10d, whatever the communicator: bookkeeping, untimed
        rec["wrong_all_ranks"] = int(total_wrong.item())
    for _ in range(spec.warmup):
        time_queued(ops, device)
    before = thread_sched() if device.type == "cpu" else {}
    if p.sequence and device.type == "cpu" and getattr(comm, "synchronous", False):
        # per-op arrival and end on the host clock every local rank shares (CLOCK_MONOTONIC)
        rec["queued_s"], rec["queued_marks_ns"] = [], []
        for _ in range(p.reps):
            marks: list = []
            rec["queued_s"].append(time_queued(ops, device, marks))
            rec["queued_marks_ns"].append(marks)
    else:
        rec["queued_s"] = [time_queued(ops, device) for _ in range(p.reps)]
    if before:  # where the timed bursts' CPU went, per thread name (barriers included)
        after = thread_sched()
        rec["queued_sched"] = {k: [a - b for a, b in zip(v, before.get(k, [0, 0, 0]))]
                               for k, v in after.items()}
        rec["queued_sched_ops"] = p.reps * len(ops)
    if p.sequence:  # each kind's ops of the step alone, as a burst: the step's time per kind
        kinds = dict.fromkeys(c.op for c in ops)
        rec["queued_kind_s"] = {k: [time_queued([c for c in ops if c.op == k], device)
                                    for _ in range(p.reps)] for k in kinds}
    if spec.blocking:
        if p.sequence:  # each op of the step alone, pass after pass: [pass0 op0, pass0 op1, …]
            passes = max(1, p.blocking_iters // len(ops))
            rec["blocking_s"] = [time_blocking(c, device) for _ in range(passes) for c in ops]
        else:
            rec["blocking_s"] = [time_blocking(ops[0], device) for _ in range(p.blocking_iters)]
    if spec.graph and device.type == "cuda":
        g = capture_graph(ops, device, comm)
        for _ in range(max(1, spec.warmup)):
            time_graph(g, device)
        rec["graph_s"] = [time_graph(g, device) for _ in range(p.reps)]
        del g
    return rec


def env_record(rank: int, world: int, device: torch.device, backend: str) -> dict:
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        nccl = ".".join(map(str, torch.cuda.nccl.version()))
    else:
        name = _cpu_name()
        nccl = None
    return {"kind": "env", "rank": rank, "world_size": world, "backend": backend,
            "host": socket.gethostname(), "device": str(device), "device_name": name,
            "torch": torch.__version__, "cuda": torch.version.cuda, "nccl": nccl,
            "threads": torch.get_num_threads(),
            "cpus": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
            "nccl_env": redact_env({k: v for k, v in sorted(os.environ.items()) if k.startswith("NCCL_")})}


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


# How long ranks may take to start, one after another (imports on a loaded machine); a rank
# that never starts is torchrun's to report (it exits), or experiment.wall_limit_s's.
RANKS_START_S = 600.0


def wait_for_every_rank(rank: int, world: int) -> None:
    """Returns once every rank has started, through torchrun's own store (MASTER_ADDR/PORT).

    init_process_group waits for the other ranks under the process group's timeout
    (experiment.pg_timeout_s), which is meant for one collective waiting for its peers: on a
    loaded 2-core box a rank started 3 s after its peer and a 3 s timeout failed the job there.
    """
    if world == 1 or "MASTER_ADDR" not in os.environ:
        return
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                          is_master=False, timeout=timedelta(seconds=RANKS_START_S))
    store.set(f"k25exp/started/{rank}", "1")
    store.wait([f"k25exp/started/{r}" for r in range(world)])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: torchrun ... -m k25exp.collectives.worker SPEC.json OUT_DIR", file=sys.stderr)
        return 2
    vllm_kernels.cap_from_env()  # hardware.vllm_cpu_isa, before vLLM loads its kernels
    spec = CollectiveSpec.load(Path(argv[0]))
    out_dir = Path(argv[1])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if spec.rank_cpus and local_rank < len(spec.rank_cpus):  # placed as the server's workers
        os.sched_setaffinity(0, spec.rank_cpus[local_rank])
        torch.set_num_threads(len(spec.rank_cpus[local_rank]))
    if spec.device == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    wait_for_every_rank(rank, world)
    if spec.communicator == "vllm":  # vLLM's init creates the process group itself
        comm = make_comm("vllm", rank, world, local_rank, spec.backend)
    else:
        kw = {"device_id": device} if device.type == "cuda" else {}
        dist.init_process_group(spec.backend, timeout=timedelta(seconds=spec.pg_timeout_s), **kw)
        comm = TorchComm()

    out_dir.mkdir(parents=True, exist_ok=True)
    gathered = open(out_dir / "gathered.jsonl", "a") if rank == 0 else None
    with open(out_dir / f"rank{rank}.jsonl", "a") as f:
        def write(rec: dict) -> None:
            f.write(json.dumps(rec) + "\n")
            f.flush()
            everyone = [None] * world if rank == 0 else None
            dist.gather_object(rec, everyone, dst=0)
            if gathered is not None:
                gathered.write("".join(json.dumps(r) + "\n" for r in everyone))
                gathered.flush()

        env = env_record(rank, world, device, spec.backend)
        if getattr(comm, "cpu_isa", None):
            env["vllm_cpu_isa"] = comm.cpu_isa  # the kernel build this rank loaded
        write(env)
        for i, p in enumerate(spec.points):
            if spec.fault_kill_rank == rank and spec.fault_at_point == i:
                f.write(json.dumps({"kind": "fault", "rank": rank, "point": i}) + "\n")
                f.flush()
                os._exit(17)  # a rank dying without cleanup, as a crash would
            rec = measure_point(spec, p, rank, world, device, comm)
            rec["point"] = i
            write(rec)
            if rank == 0:
                print(f"[k25exp] {spec.op} point {i + 1}/{len(spec.points)}: "
                      f"label={p.label} bytes={rec['bytes']}", flush=True)
            if rec.get("wrong_all_ranks"):
                dist.destroy_process_group()
                return 3
    dist.barrier()
    if spec.communicator == "vllm":
        from vllm.distributed import destroy_distributed_environment, destroy_model_parallel

        destroy_model_parallel()  # frees vLLM's shared-memory segments
        destroy_distributed_environment()
    else:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
