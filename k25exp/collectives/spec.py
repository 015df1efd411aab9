"""What the Hydra side asks a torchrun worker to measure: a JSON-serialisable spec.

The spec is the only contract between the two processes, so it holds plain numbers and
strings; the worker needs nothing from the config system to read it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

OPS = ("all_reduce", "all_to_all", "all_gather", "step")
COMMUNICATORS = ("torch", "vllm")


@dataclass
class Point:
    """One measured configuration: a message of `numel` elements.

    queued: `reps` bursts of `burst` ops issued back to back, each burst timed as a whole.
    blocking: `blocking_iters` ops timed one at a time (barrier, op, wait, sync).
    graph (CUDA): the burst captured once in a CUDA graph, replayed `reps` times.
    """

    label: int  # the swept quantity this point stands for (tokens, bytes)
    numel: int  # elements per rank in the (send) buffer
    burst: int
    reps: int
    blocking_iters: int
    # op "step": the burst is this sequence of [op, numel] (a decode step's collectives, in
    # order; burst = its length); blocking times each op of it, pass after pass.
    sequence: Optional[list] = None


@dataclass
class CollectiveSpec:
    op: str
    dtype: str
    device: str  # cpu | cuda
    backend: str  # gloo | nccl
    points: list[Point]
    warmup: int = 5
    check: bool = True
    blocking: bool = True
    graph: bool = False
    pg_timeout_s: float = 600.0  # the process group's timeout (one op waiting for peers)
    fault_kill_rank: Optional[int] = None
    fault_at_point: int = 0
    fault_corrupt_rank: Optional[int] = None
    # torch: PyTorch's c10d ops; vllm: vLLM's own TP-group communicator (the path its server
    # runs: the CPU build's shared-memory all-reduce, the GPU build's custom all-reduce /
    # symmetric memory / pynccl), set up by vLLM's distributed init in every rank.
    communicator: str = "torch"
    # CPU: each local rank's CPUs (rank r runs on rank_cpus[r], torch with that many threads),
    # as vLLM's CPU server binds its TP workers; None: unbound.
    rank_cpus: Optional[list] = None
    extra: dict = field(default_factory=dict)

    def dump(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=1))

    @classmethod
    def load(cls, path: Path) -> "CollectiveSpec":
        d = json.loads(Path(path).read_text())
        d["points"] = [Point(**p) for p in d["points"]]
        return cls(**d)
