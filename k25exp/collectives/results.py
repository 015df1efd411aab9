"""Reads what the ranks wrote and turns it into per-point results and bandwidths.

Definitions (nccl-tests, https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md):
algbw = S / t with S the per-rank buffer (for All-to-All the whole send buffer);
busbw = algbw × 2(n−1)/n for AllReduce and × (n−1)/n for All-to-All, AllGather and Gather.
A sequence of ops of several kinds (a decode step) has bus bytes Σ S_i × factor(op_i) and
busbw = bus bytes / t. GB/s = 1e9 B/s.
Across ranks, each sample is the slowest rank's (every sample starts at a barrier, so the
collective is done only when the last rank is).

Wait vs transport, for a burst whose ops return when done (vLLM's CPU communicator, ranks on
one host): each op on rank r is split at its last arrival over the ranks, as
k25exp.traces.comm_split splits the server's collectives: wait_r = last − start_r, transport_r
= end_r − last. Summed over the step's ops, mean over ranks, median over bursts. Ops issued
back to back make every rank that finishes an op first wait in the next one for the rank
that finished last (a thread handoff later); that wait is not the link's, and the server's
own wait is the profile's. The end here is the caller's return, so transport also holds the
hand-back from gloo's worker thread to the caller, which the analyser's span (the worker's
end) leaves out (tens of µs per op on CPU).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

from k25exp.stats import mean, median, min_samples, percentile


def bus_factor(op: str, world: int) -> float:
    if op == "all_reduce":
        return 2 * (world - 1) / world
    if op in ("all_to_all", "all_gather", "gather"):
        return (world - 1) / world
    raise ValueError(f"unknown collective {op!r}")


def bandwidths(nbytes: int, seconds: float, op: str, world: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s for one op moving `nbytes` per rank in `seconds`."""
    algbw = nbytes / seconds / 1e9
    return algbw, algbw * bus_factor(op, world)


@dataclass
class PointResult:
    index: int
    label: int
    nbytes: int
    numel: int
    burst: int
    queued_s: list[float]
    blocking_s: list[float] = field(default_factory=list)
    graph_s: Optional[list[float]] = None
    wrong: int = 0  # summed over ranks
    wrong_detail: list[dict] = field(default_factory=list)
    sequence_ops: Optional[list[str]] = None  # a decode step's collectives, in order
    sequence_bytes: Optional[list[int]] = None
    impl: dict = field(default_factory=dict)  # the communicator and what it picked
    queued_kind_s: dict = field(default_factory=dict)  # a sequence's ops of one kind, bursts
    # per burst, Σ over the ops of (wait, transport) in s, mean over ranks (module docstring)
    queued_split_s: Optional[list[tuple[float, float]]] = None
    # CPU ranks: per thread name, [CPU µs, run-queue wait µs] per op timed in the queued
    # bursts, mean over ranks (worker.thread_sched; barriers included)
    sched_us_per_op: dict = field(default_factory=dict)

    def bus_bytes(self, world: int, op: str = "all_reduce") -> float:
        """Bytes that count for bus bandwidth: each op of a sequence with its own kind's
        factor (a step's all-gather is not an all-reduce); one op kind `op` otherwise."""
        if self.sequence_ops and self.sequence_bytes:
            return sum(b * bus_factor(o, world) for o, b in zip(self.sequence_ops, self.sequence_bytes))
        return self.nbytes * bus_factor(op, world)

    def step_ms_by_kind(self) -> dict[str, float]:
        """A sequence's ops of each kind issued alone as a burst: median burst, ms per step."""
        return {k: median(v) * 1e3 for k, v in self.queued_kind_s.items()}

    def op_blocking_us(self) -> list[float]:
        """A sequence's per-op blocking latency: the median over passes of each op, µs."""
        k = len(self.sequence_ops or ())
        if not k or not self.blocking_s:
            return []
        return [median(self.blocking_s[i::k]) * 1e6 for i in range(k)]

    def step_ms_by_op(self) -> dict[str, float]:
        """Σ of the per-op blocking medians of a sequence, per op kind (ms per step)."""
        out: dict[str, float] = {}
        for op, us in zip(self.sequence_ops or (), self.op_blocking_us()):
            out[op] = out.get(op, 0.0) + us / 1e3
        return out

    @property
    def queued_op_us(self) -> float:
        """nccl-tests' time: a burst of back-to-back ops divided by its length (median burst)."""
        return median(self.queued_s) / self.burst * 1e6

    @property
    def burst_ms(self) -> float:
        return median(self.queued_s) * 1e3

    @property
    def burst_wait_ms(self) -> Optional[float]:
        return median([w for w, _ in self.queued_split_s]) * 1e3 if self.queued_split_s else None

    @property
    def burst_transport_ms(self) -> Optional[float]:
        return median([t for _, t in self.queued_split_s]) * 1e3 if self.queued_split_s else None

    def blocking_us(self, q: float) -> float:
        return percentile(self.blocking_s, q) * 1e6

    def blocking_figures(self, prefix: str, qs=(50, 99)) -> dict[str, float]:
        """prefix_p<q> (µs) for the percentiles the number of timed ops supports
        (stats.min_samples: p99 needs 100), and prefix_n, that number."""
        n = len(self.blocking_s)
        out = {f"{prefix}_p{q}": self.blocking_us(q) for q in qs if n >= min_samples(q)}
        out[f"{prefix}_n"] = n
        return out

    @property
    def blocking_us_mean(self) -> float:
        return mean(self.blocking_s) * 1e6

    @property
    def graph_burst_ms(self) -> Optional[float]:
        return median(self.graph_s) * 1e3 if self.graph_s else None

    @property
    def graph_op_us(self) -> Optional[float]:
        """queued_op_us for the same burst replayed from a CUDA graph (None off CUDA)."""
        return median(self.graph_s) / self.burst * 1e6 if self.graph_s else None


@dataclass
class RankFiles:
    world_size: int
    env: list[dict]
    points: list[PointResult]  # complete points only (every rank wrote them)
    faults: list[dict]
    incomplete_points: int


def read_jsonl(path: Path) -> list[dict]:
    """Records of a JSONL file up to a torn last line (a writer killed mid-line)."""
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            break  # a rank killed mid-write leaves a torn last line
    return out


def _elementwise_max(lists: Sequence[Sequence[float]]) -> list[float]:
    return [max(xs) for xs in zip(*lists)]


def split_bursts(marks: Sequence[Sequence[Sequence[Sequence[int]]]]
                 ) -> Optional[list[tuple[float, float]]]:
    """marks[rank][burst][op] = [start_ns, end_ns] on one clock -> per burst (wait, transport)
    in s, each Σ over ops and mean over ranks (module docstring); None when the ranks' bursts
    or ops do not line up."""
    n_ranks = len(marks)
    if n_ranks < 2 or len({len(m) for m in marks}) != 1:
        return None
    out = []
    for b in range(len(marks[0])):
        per_rank = [marks[r][b] for r in range(n_ranks)]
        if len({len(ops) for ops in per_rank}) != 1:
            return None
        wait = transport = 0
        for i in range(len(per_rank[0])):
            last = max(ops[i][0] for ops in per_rank)
            wait += sum(last - ops[i][0] for ops in per_rank)
            transport += sum(ops[i][1] - last for ops in per_rank)
        out.append((wait / n_ranks / 1e9, transport / n_ranks / 1e9))
    return out


def sched_per_op(rs: Sequence[dict]) -> dict[str, list[float]]:
    """Per thread name, [CPU, run-queue wait] in µs per op of the queued bursts, mean over the
    ranks that have the thread; {} unless every rank recorded its threads."""
    if not rs or not all("queued_sched" in r and r.get("queued_sched_ops") for r in rs):
        return {}
    names = sorted({n for r in rs for n in r["queued_sched"]})
    out = {}
    for n in names:
        have = [r for r in rs if n in r["queued_sched"]]
        out[n] = [sum(r["queued_sched"][n][i] / r["queued_sched_ops"] for r in have) / len(have) / 1e3
                  for i in (0, 1)]
    return out


def read_rank_files(raw_dir: Path) -> RankFiles:
    """Every rank's records: rank 0's gathered copy when there is one (it is the only
    complete copy on several nodes), else the per-rank files; faults from the rank files."""
    local = [r for p in sorted(raw_dir.glob("rank*.jsonl")) for r in read_jsonl(p)]
    gathered = raw_dir / "gathered.jsonl"
    if gathered.exists():
        recs = read_jsonl(gathered) + [r for r in local if r["kind"] == "fault"]
    else:
        recs = local
    env = sorted((r for r in recs if r["kind"] == "env"), key=lambda r: r["rank"])
    world = env[0]["world_size"] if env else 0
    one_host = len({e.get("host") for e in env}) == 1  # one clock: marks comparable
    by_point: dict[int, list[dict]] = {}
    for r in recs:
        if r["kind"] == "point":
            by_point.setdefault(r["point"], []).append(r)
    points, incomplete = [], 0
    for i in sorted(by_point):
        rs = sorted(by_point[i], key=lambda r: r["rank"])
        if len(rs) < world:
            incomplete += 1
            continue
        first = rs[0]
        points.append(PointResult(
            index=i, label=first["label"], nbytes=first["bytes"], numel=first["numel"],
            burst=first["burst"],
            queued_s=_elementwise_max([r["queued_s"] for r in rs]),
            blocking_s=_elementwise_max([r.get("blocking_s", []) for r in rs]),
            graph_s=_elementwise_max([r["graph_s"] for r in rs]) if "graph_s" in first else None,
            wrong=sum(r.get("wrong", 0) for r in rs),
            wrong_detail=[{k: r[k] for k in ("rank", "wrong", "first_wrong_index", "got", "expected",
                                             "wrong_op", "wrong_bytes")
                           if k in r} for r in rs if r.get("wrong")],
            sequence_ops=first.get("sequence_ops"), sequence_bytes=first.get("sequence_bytes"),
            impl=first.get("impl") or {},
            queued_kind_s={k: _elementwise_max([r["queued_kind_s"][k] for r in rs])
                           for k in first.get("queued_kind_s", {})},
            queued_split_s=split_bursts([r["queued_marks_ns"] for r in rs])
            if one_host and all("queued_marks_ns" in r for r in rs) else None,
            sched_us_per_op=sched_per_op(rs),
        ))
    faults = [r for r in recs if r["kind"] == "fault"]
    return RankFiles(world, env, points, faults, incomplete)


def find_knee(labels: Sequence[int], latencies: Sequence[float], factor: float,
              baseline_points: int) -> Optional[int]:
    """Smallest label whose latency exceeds factor × the flat small-size baseline.

    The baseline is the median latency of the first `baseline_points` points; a knee inside
    the baseline window itself is not reported (there is no flat regime to jump from).
    """
    if len(latencies) <= baseline_points or baseline_points < 1:
        return None
    base = median(latencies[:baseline_points])
    for label, lat in zip(labels[baseline_points:], latencies[baseline_points:]):
        if lat > factor * base:
            return label
    return None
